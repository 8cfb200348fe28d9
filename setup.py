"""Build vllm-hpu for one target device: VLLM_TARGET_DEVICE=cpu (default here), hpu or cuda.

The target picks requirements/<target>.txt, the version suffix (+gaudi on HPU), and
is recorded in vllm/_build_info.py so the platform layer knows what it was built for.
"""
import os
import re

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("cpu", "hpu", "cuda")
BASE_VERSION = "0.1.0"
SUFFIX = {"cpu": "+cpu", "hpu": "+gaudi", "cuda": ""}


def target_device() -> str:
    target = os.environ.get("VLLM_TARGET_DEVICE", "cpu").strip().lower()
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


def write_build_info(target: str, version: str) -> None:
    with open(os.path.join(ROOT, "vllm", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py: the device this build targets.\n")
        f.write(f"TARGET_DEVICE = {target!r}\nVERSION = {version!r}\n")


TARGET = target_device()
VERSION = BASE_VERSION + SUFFIX[TARGET]
write_build_info(TARGET, VERSION)

setup(
    name="vllm",
    version=VERSION,
    description="A vLLM-compatible LLM inference and serving engine with an Intel Gaudi backend",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm", "vllm.*"]),
    package_data={"vllm": ["py.typed", "native/*.cpp"]},
    install_requires=read_requirements(f"{TARGET}.txt"),
    extras_require={"test": read_requirements("test.txt"), "ray": ["ray>=2.10"]},
    entry_points={"console_scripts": ["vllm = vllm.entrypoints.cli.main:main"]},
)
