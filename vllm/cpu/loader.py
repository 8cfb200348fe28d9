"""Builds `cpu_ops.cpp` once with the system C++ compiler and loads it with ctypes.

Why at first use instead of at install time: the kernels are compiled with
`-march=native` for the machine that runs them (AVX-512 and its bf16 dot products
where present), and a plain C ABI library needs no torch headers, so the build takes
a few seconds. The result is cached under `$VLLM_CACHE_ROOT/native/`, keyed by the
source, the compiler and the CPU's feature flags; later starts only load it.

Nothing here is required: without a compiler, with `VLLM_CPU_NATIVE_OPS=0`, or if the
build fails, `get_native_lib()` returns None and every caller keeps its torch path
(logged once, with the reason).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Optional

from vllm import envs

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_ops.cpp")
CXX_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BUILD_TIMEOUT_S = 120

_i64, _i32, _f32, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
# name -> argument types (see the extern "C" block of cpu_ops.cpp).
SIGNATURES: dict[str, tuple] = {
    "vllm_cpu_ops_version": (),
    "vllm_has_bf16_gemm": (),
    "vllm_rms_norm": (_i32, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _f32, _i32),
    "vllm_rotary": (_i32, _ptr, _i64, _i64, _i64, _i64, _i64, _ptr, _ptr, _i32, _i32),
    "vllm_silu_and_mul": (_i32, _ptr, _i64, _ptr, _i64, _i64, _i64, _i32),
    "vllm_argmax": (_i32, _ptr, _i64, _i64, _i64, _ptr, _i32),
    "vllm_write_kv": (_i32, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _i64, _i64, _i32),
    "vllm_decode_attention": (_i32, _i32, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr, _i64,
                              _i64, _i64, _i64, _i64, _f32, _f32, _ptr, _i64, _i32),
    "vllm_packed_numel": (_i64, _i64),
    "vllm_pack_bf16": (_ptr, _i64, _i64, _ptr, _i32),
    "vllm_gemm_bf16_packed": (_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64, _i32),
    "vllm_has_amx_gemm": (),
    "vllm_gemm_bf16_amx": (_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64, _i32),
    "vllm_linear_bf16_packed": (_ptr, _ptr, _i64, _i64, _ptr, _i64, _i32),
    "vllm_max_lora_rank": (),
    "vllm_llama_decode_layer": (_ptr, _ptr, _i32, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr,
                                _i32),
}
RETURNS_INT = ("vllm_cpu_ops_version", "vllm_has_bf16_gemm", "vllm_has_amx_gemm",
               "vllm_gemm_bf16_amx", "vllm_pack_bf16",
               "vllm_gemm_bf16_packed", "vllm_llama_decode_layer", "vllm_max_lora_rank")
RETURNS_INT64 = ("vllm_packed_numel",)

_lock = threading.Lock()
_state: dict[str, object] = {}


def get_native_lib() -> Optional[ctypes.CDLL]:
    """The loaded kernel library, or None when it is disabled or cannot be built."""
    if "lib" in _state:
        return _state["lib"]  # type: ignore[return-value]
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _load()
    return _state["lib"]  # type: ignore[return-value]


def _load() -> Optional[ctypes.CDLL]:
    if not envs.VLLM_CPU_NATIVE_OPS:
        logger.info("Native CPU kernels disabled (VLLM_CPU_NATIVE_OPS=0).")
        return None
    try:
        path = build_library()
        lib = ctypes.CDLL(str(path))
        _declare(lib)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logger.warning("Native CPU kernels unavailable, using torch ops instead: %s", e)
        return None
    logger.debug("Loaded native CPU kernels from %s", path)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = list(argtypes)
        fn.restype = (ctypes.c_int if name in RETURNS_INT
                      else ctypes.c_int64 if name in RETURNS_INT64 else None)


def _compiler() -> str:
    cxx = envs.CXX or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise RuntimeError(f"no C++ compiler found ({cxx!r}; set CXX to choose one)")
    return path


def _cpu_flags() -> str:
    """The CPU feature list, part of the cache key (the build is -march=native)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return os.uname().machine


_versions: dict[str, str] = {}
"""compiler path -> its `--version` text (asked once per process)."""


def _cache_key(cxx: str, source: Path = SOURCE) -> str:
    version = _versions.get(cxx)
    if version is None:
        version = _versions[cxx] = subprocess.run([cxx, "--version"], capture_output=True,
                                                  text=True, timeout=30).stdout
    digest = hashlib.sha256()
    # The headers the kernel files share (vec_math.h) are part of every build.
    headers = [h.read_bytes() for h in sorted(source.parent.glob("*.h"))]
    for part in (source.read_bytes(), *headers, version.encode(),
                 " ".join(CXX_FLAGS).encode(), _cpu_flags().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def build_library(source: Path = SOURCE) -> Path:
    """Path of the built library of `source` (cpu_ops.cpp unless another kernel file
    of this folder is named), compiling it first if this key has no build yet.

    The compiler writes to a temporary file that is renamed into place, so processes
    starting together (TP workers) never load a half-written library; within a process
    one lock per source makes a second caller wait for the first build instead of
    compiling again.
    """
    with _build_locks.setdefault(source.name, threading.Lock()):
        cxx = _compiler()
        out_dir = Path(envs.VLLM_CACHE_ROOT) / "native"
        target = out_dir / f"{source.stem}-{_cache_key(cxx, source)}.so"
        if target.exists():
            return target
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
        os.close(fd)
        try:
            logger.info("Building native CPU kernels %s (once; cached in %s)", source.name,
                        out_dir)
            proc = subprocess.run([cxx, *CXX_FLAGS, "-o", tmp, str(source)],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"{cxx} failed: {proc.stderr.strip()[-2000:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target


_build_locks: dict[str, threading.Lock] = {}


def prebuild() -> None:
    """Build the kernel libraries every CPU engine loads (cpu_ops and prefill_ops) now,
    where this machine has no cached build yet: the CPU worker's device initialization
    calls it, before its runner's first native call. A failure is left for the load
    to report (once, with its fallback)."""
    if not envs.VLLM_CPU_NATIVE_OPS:
        return
    for source in (SOURCE, SOURCE.with_name("prefill_ops.cpp")):
        try:
            build_library(source)
        except (OSError, RuntimeError, subprocess.SubprocessError):
            return


_side_libs: dict[Path, Optional[ctypes.CDLL]] = {}
_side_lock = threading.Lock()


def load_side_library(source: Path, signatures: dict[str, tuple[list, object]],
                      unavailable: str) -> Optional[ctypes.CDLL]:
    """The library of a kernel file kept apart from cpu_ops (prefill_ops, quant_ops),
    built and loaded once per process, its functions typed from `signatures`
    ({name: (argtypes, restype)}). None when native ops are disabled or the build or
    load fails; `unavailable` says in the one warning what the caller falls back to."""
    if source not in _side_libs:
        with _side_lock:
            if source not in _side_libs:
                _side_libs[source] = _load_side_library(source, signatures, unavailable)
    return _side_libs[source]


def _load_side_library(source: Path, signatures: dict[str, tuple[list, object]],
                       unavailable: str) -> Optional[ctypes.CDLL]:
    if not envs.VLLM_CPU_NATIVE_OPS:
        return None
    try:
        lib = ctypes.CDLL(str(build_library(source)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logger.warning("%s: %s", unavailable, e)
        return None
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(argtypes), restype
    return lib
