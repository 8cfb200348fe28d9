"""Build vllm-hpu for one target device: cpu, hpu (Intel Gaudi) or cuda.

The target comes from VLLM_TARGET_DEVICE, or, when that is unset, from what the
environment holds (`detect_target_device`): hpu where `habana_frameworks` is
installed (a Gaudi PyTorch image), cuda where torch is a CUDA build or `nvidia-smi`
lists a GPU, else cpu. It picks requirements/<target>.txt (hpu.txt has no torch: the
image's own build must stay), the version suffix (+gaudi on HPU), the HPU plugin
entry points, and is recorded in vllm/_build_info.py so the platform layer knows
what it was built for.

Importable without side effects (everything runs under `__main__`, which is how
both `python setup.py ...` and pip execute it), so tests can check the detection.
"""
from __future__ import annotations

import importlib.machinery
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from typing import Optional

ROOT = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("cpu", "hpu", "cuda")
BASE_VERSION = "0.1.0"
SUFFIX = {"cpu": "+cpu", "hpu": "+gaudi", "cuda": ""}

HPU_ENTRY_POINTS = {
    # vLLM's plugin groups: the platform (applies the Gaudi runtime settings, returns
    # the platform class) and the general plugin that binds the HPU op kernels.
    "vllm.platform_plugins": ["hpu = vllm.hpu.plugin:register"],
    "vllm.general_plugins": ["hpu_custom_ops = vllm.hpu.plugin:register_ops"],
}


def install_dirs() -> list[str]:
    """Where this interpreter's packages are installed.

    `sys.path` alone is not enough: pip builds in an isolated environment that
    removes site-packages from `sys.path` (but not from `site` / `sysconfig`), and a
    Gaudi image installs `habana_frameworks` there.
    """
    dirs = list(sys.path)
    if hasattr(site, "getsitepackages"):
        dirs += site.getsitepackages()
    dirs.append(site.getusersitepackages())
    paths = sysconfig.get_paths()
    dirs += [paths["purelib"], paths["platlib"]]
    seen: list[str] = []
    for d in dirs:
        d = os.path.abspath(d or os.curdir)
        if d not in seen and os.path.isdir(d):
            seen.append(d)
    return seen


def find_installed(module: str, dirs: list[str]) -> Optional[str]:
    """Directory or file of top-level `module` in `dirs` (nothing is imported)."""
    spec = importlib.machinery.PathFinder.find_spec(module, dirs)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return spec.origin


def torch_is_cuda_build(dirs: list[str]) -> bool:
    """An installed torch built for CUDA (its version.py records `cuda = '12.x'`)."""
    torch_dir = find_installed("torch", dirs)
    version_py = os.path.join(torch_dir or "", "version.py")
    if not torch_dir or not os.path.isfile(version_py):
        return False
    with open(version_py) as f:
        return re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]", f.read(), re.MULTILINE) is not None


def nvidia_gpu_listed() -> bool:
    """`nvidia-smi -L` runs and names at least one GPU."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def detect_target_device(dirs: Optional[list[str]] = None) -> str:
    """hpu if habana_frameworks is installed, cuda if torch/the driver is CUDA, else cpu.

    Gaudi comes first: its image ships a torch of its own that must never be
    replaced, and `habana_frameworks` is what marks it.
    """
    dirs = install_dirs() if dirs is None else dirs
    if find_installed("habana_frameworks", dirs) is not None:
        return "hpu"
    if torch_is_cuda_build(dirs) or nvidia_gpu_listed():
        return "cuda"
    return "cpu"


def target_device() -> str:
    """VLLM_TARGET_DEVICE when given (validated), else `detect_target_device()`."""
    target = os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower()
    if not target:
        return detect_target_device()
    if target not in TARGETS:
        raise ValueError(f"VLLM_TARGET_DEVICE={target!r}; choose one of {', '.join(TARGETS)}")
    return target


def read_requirements(name: str) -> list[str]:
    """requirements/<name>.txt with '-r other.txt' includes expanded."""
    reqs = []
    with open(os.path.join(ROOT, "requirements", name)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            match = re.match(r"-r\s+(\S+)", line)
            reqs.extend(read_requirements(match.group(1)) if match else [line])
    return reqs


def entry_points(target: str) -> dict[str, list[str]]:
    """The console script everywhere; vLLM's plugin groups on HPU builds only."""
    points = {"console_scripts": ["vllm = vllm.entrypoints.cli.main:main"]}
    if target == "hpu":
        points.update(HPU_ENTRY_POINTS)
    return points


def write_build_info(target: str, version: str) -> None:
    with open(os.path.join(ROOT, "vllm", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py: the device this build targets.\n")
        f.write(f"TARGET_DEVICE = {target!r}\nVERSION = {version!r}\n")


def main() -> None:
    from setuptools import find_packages, setup

    target = target_device()
    version = BASE_VERSION + SUFFIX[target]
    requirements = f"requirements/{target}.txt"
    source = "VLLM_TARGET_DEVICE" if os.environ.get("VLLM_TARGET_DEVICE", "").strip() \
        else "detected"
    # On stderr, where pip -v and `python setup.py` show it: which build this is.
    print(f"vllm-hpu build: target {target} ({source}), version {version}, "
          f"install_requires from {requirements}", file=sys.stderr)
    write_build_info(target, version)
    setup(
        name="vllm",
        version=version,
        description="A vLLM-compatible LLM inference and serving engine with an Intel "
                    "Gaudi backend",
        python_requires=">=3.10",
        packages=find_packages(include=["vllm", "vllm.*"]),
        package_data={"vllm": ["py.typed", "cpu/*.cpp", "cpu/*.h",
                                "benchmarks/data/*.txt"]},
        install_requires=read_requirements(f"{target}.txt"),
        extras_require={"test": read_requirements("test.txt"), "ray": ["ray>=2.10"]},
        entry_points=entry_points(target),
    )


if __name__ == "__main__":
    main()
