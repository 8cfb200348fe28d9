"""Starting the engine-core process: fork where it is safe, and as early as possible.

Why fork: spawn starts a fresh interpreter that imports torch, transformers and vLLM
again (4-5 s of a server's start on a small machine) and re-imports the main module. A
forked child starts with everything its parent imported.

When fork is safe: fork copies only the calling thread. A process whose OpenMP pool
(torch's first parallel op), tokenizer pool, ZMQ I/O threads or any helper thread
already runs would hand the child locks held by threads that do not exist there (the
child's first multi-threaded torch op hangs). So, unless VLLM_WORKER_MULTIPROC_METHOD
is set, the core is forked only while this process has no thread but the main one
(read from /proc/self/task, which counts native threads too), OpenBLAS's pool aside
(numpy starts it at import; OpenBLAS's own fork handler stops and restarts it), and no
accelerator runtime or Ray is loaded (`fork_unsafe_reason`); otherwise it is spawned, as before. Set explicitly, the
variable is honoured (fork still falls back to spawn where CUDA/HPU/Ray run, as for
the TP workers).

Why early: the server forks the core before it builds the config and before it imports
its web stack (`prestart`, from vllm/entrypoints/openai/core_prestart.py or
`run_server`: one thread, nothing bound yet, not even the listening socket). The child
imports what an engine core needs while the server reads the model's config and loads
the tokenizer, then waits for the `VllmConfig` that `MPEngineCoreClient` sends it over
a pipe. That pipe is also the core's death pipe: EOF before the config (the server
failed while starting) or after it (the server died) ends the child.

Given the server's engine arguments, where building the config reads only local, ready
files, the server builds it just before the fork and the core initializes from it at
once, while the server sets itself up; the core serves with it only if the config the
server then sends, and its environment, are equal (vllm/engine/core_speculation.py).
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import multiprocessing
import os
import signal
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Optional

logger = logging.getLogger(__name__)

PREIMPORTS = ("vllm.engine.core", "vllm.model_executor.model_loader",
              "vllm.model_executor.models.registry", "vllm.worker.kv_cache_alloc",
              "transformers.configuration_utils", "transformers.activations")
"""What every engine core imports and a server does not, imported by an early-started
core while its server builds the config (the CPU's native ops are added when the CPU
platform is the current one; the model's own module is imported once it is known)."""


def thread_count() -> Optional[int]:
    """This process's OS threads (native ones included); None where /proc is missing."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _openblas_pool_threads() -> int:
    """Threads of the OpenBLAS pools loaded here (numpy's starts one at import, with
    `get_num_threads() - 1` workers). Safe to fork: OpenBLAS stops its pool before a
    fork and starts it again when needed (its own pthread_atfork handler)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {fields[-1] for fields in map(str.split, f)
                     if len(fields) == 6 and ".so" in fields[-1]
                     and "openblas" in os.path.basename(fields[-1]).lower()}
    except OSError:
        return 0
    pool = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in _OPENBLAS_GET_THREADS:
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                pool += max(0, fn() - 1)
                break
    return pool


_OPENBLAS_GET_THREADS = ("openblas_get_num_threads", "openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads")


def other_threads() -> Optional[int]:
    """Threads besides the main one that a fork would leave half-way (an OpenMP pool, a
    tokenizer or ZMQ pool, a helper thread): all but the OpenBLAS pools'. None where
    this cannot be read (no /proc)."""
    total = thread_count()
    if total is None:
        return None
    return max(0, total - 1 - _openblas_pool_threads())


def start_method() -> str:
    """'fork' or 'spawn' for the engine-core process (see the module docstring)."""
    from vllm.executor.multiproc_utils import (check_main_reimportable, fork_unsafe_reason,
                                               resolve_mp_method)
    from vllm import envs
    asked = envs.is_set("VLLM_WORKER_MULTIPROC_METHOD")
    if asked and envs.VLLM_WORKER_MULTIPROC_METHOD.strip():
        method = resolve_mp_method()  # validates it; fork -> spawn where fork is unsafe
        others = other_threads()
        if method == "fork" and others != 0:
            logger.warning("VLLM_WORKER_MULTIPROC_METHOD=fork: forking the engine core from "
                           "a process with %s other threads; a child of a process whose "
                           "OpenMP pool already runs can hang on its first multi-threaded "
                           "op.", others if others is not None else "maybe")
        return method
    if fork_unsafe_reason() is None and other_threads() == 0:
        return "fork"
    try:
        check_main_reimportable()
    except RuntimeError:
        logger.warning("The main module was read from stdin: starting the engine core with "
                       "fork, which hangs if this process already ran torch on several "
                       "threads. Save the script to a file to avoid it.")
        return "fork"
    return "spawn"


def mp_context(method: str) -> Any:
    return multiprocessing.get_context(method)


# ------------------------------------------------------------------ early start
@dataclass
class PrestartedCore:
    """A forked engine-core process waiting for its config on `conn`."""
    proc: BaseProcess
    conn: Connection
    """This end of the launch pipe: the config is sent on it, then it is the death
    pipe (closing it ends the child)."""


_prestarted: Optional[PrestartedCore] = None


def prestart(engine_args: Optional[Any] = None) -> bool:
    """Fork an engine-core process now, when fork is the method and safe; True if one
    was started. The next `MPEngineCoreClient` of this process takes it (`take`).
    `engine_args`: the arguments the server will build its config from; where it is
    safe, the config is built from them now and the core initializes from it without
    waiting for the server's (core_speculation.py)."""
    global _prestarted
    if _prestarted is not None:
        return True
    if start_method() != "fork":
        return False
    config = _config_before_fork(engine_args)
    if config is not None and start_method() != "fork":
        return False  # building it started a thread: spawn later, as without an early core
    from vllm.executor.multiproc_utils import register_engine_side
    ctx = mp_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    register_engine_side(writer)  # closed in every forked child: the core sees EOF
    # Not a daemon: the core starts worker processes of its own (TP/PP).
    proc = ctx.Process(target=_wait_for_config, args=(reader, config),
                       name="EngineCore", daemon=False)
    proc.start()
    reader.close()
    _prestarted = PrestartedCore(proc, writer)
    weakref.finalize(proc, _abandon, proc, writer)
    logger.debug("Engine core process forked early (pid %d).", proc.pid)
    return True


def _config_before_fork(engine_args: Optional[Any]) -> Optional[Any]:
    """The server's config built now, for the core to initialize from at once, where that
    is safe (core_speculation.py); None otherwise. This process then never builds the
    native kernels: the core's worker builds them if they are missing."""
    if engine_args is None:
        return None
    from vllm.engine import core_speculation
    if not core_speculation.builds_without_side_effects(engine_args):
        return None
    return core_speculation.build_config(engine_args)


def take() -> Optional[PrestartedCore]:
    """The early-started core, once (None when there is none or it already exited)."""
    global _prestarted
    found, _prestarted = _prestarted, None
    if found is not None and not found.proc.is_alive():
        found.conn.close()
        return None
    return found


def release() -> None:
    """Let an early core that no engine took exit now (EOF on its pipe) instead of
    idling until this process exits."""
    found = take()
    if found is not None:
        _abandon(found.proc, found.conn)


def _abandon(proc: BaseProcess, conn: Connection) -> None:
    """Never taken (the server failed before its engine): EOF lets the child exit."""
    try:
        conn.close()
    except OSError:
        pass
    proc.join(5.0)


def _wait_for_config(conn: Connection, vllm_config: Optional[Any] = None) -> None:
    """The early core: import what a core needs (and initialize from `vllm_config`, the
    server's config built before the fork, if given), then run once the server's config
    arrives."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the server decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    forked_environ = dict(os.environ)
    _preimport()
    speculative = None
    if vllm_config is not None:
        from vllm.engine import core_speculation
        from vllm.executor.multiproc_utils import prefix_log_lines
        prefix_log_lines(None, kind="EngineCore")  # its initialization logs from here
        # What the imports set (torch's cache directories) is dropped, as the server's
        # environment replaces it below when the core waits for the config.
        adopt_environment(forked_environ)
        speculative = core_speculation.start(vllm_config)
    try:
        environ, kwargs = conn.recv()
    except (EOFError, OSError):
        os._exit(0)  # the server stopped before it built its engine
    core = None
    if speculative is not None:
        core = core_speculation.adopt_or_discard(speculative, kwargs["vllm_config"], environ)
    adopt_environment(environ)
    if core is None:
        preimport(kwargs["vllm_config"])
    from vllm.engine.core_proc import run_engine_core
    run_engine_core(death_reader=conn, core=core, **kwargs)


def launch(early: PrestartedCore, **kwargs: Any) -> None:
    """Send the early core what a spawned one gets: `run_engine_core`'s arguments, and
    this process's environment as it is now (building the config may have set
    variables the core's runtime reads, e.g. the HPU's lazy collectives)."""
    early.conn.send((dict(os.environ), kwargs))


def adopt_environment(environ: dict[str, str]) -> None:
    """Make os.environ equal to `environ` (the frontend's at launch)."""
    for name in set(os.environ) - set(environ):
        os.environ.pop(name, None)
    os.environ.update(environ)


def _preimport() -> None:
    names = list(PREIMPORTS)
    if _current_platform_is_cpu():
        names.append("vllm.cpu.ops")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - only a head start; the core imports it again
            logger.debug("Pre-importing %s failed.", name, exc_info=True)


def preimport(vllm_config: Any) -> None:
    """Import the model's module (its architecture is known now)."""
    try:
        from vllm.model_executor.models.registry import ModelRegistry
        ModelRegistry.resolve_model_cls(vllm_config.model_config.architectures)
    except Exception:  # noqa: BLE001 - the core reports a bad architecture itself
        logger.debug("Pre-importing the model class failed.", exc_info=True)


def _current_platform_is_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
        return current_platform.is_cpu()
    except Exception:  # noqa: BLE001 - the core reports a platform error itself
        return False
