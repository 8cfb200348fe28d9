"""`vllm collect-env` (and `python -m vllm.collect_env`): what a bug report needs.

The machine (OS, CPU model and the instruction sets the kernels choose by, memory), the
software (Python, torch and its CUDA, vLLM and its build target, the Gaudi software
stack, the libraries the engine leans on), the platform this process would run on and
its devices, and every VLLM_* / PT_HPU_* / HABANA_* / HF_* variable set (secrets masked).
Each probe that fails says so in its line; none stops the report.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Callable

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "xgrammar", "llguidance",
            "triton", "numpy", "fastapi", "uvicorn", "pydantic", "openai", "ray", "peft",
            "compressed-tensors", "habana-torch-plugin", "habana-torch-dataloader",
            "neural-compressor")
ENV_PREFIXES = ("VLLM_", "PT_HPU_", "HABANA_", "HF_", "OMP_", "CUDA_VISIBLE_DEVICES",
                "HABANA_VISIBLE_DEVICES", "TORCH_")
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


def _probe(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a report line, never a crash
        return f"could not collect ({type(e).__name__}: {e})"


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return ", ".join(f for f in CPU_FLAGS if f in flags) or "none of " + \
                    ", ".join(CPU_FLAGS)
    return "unknown"


def memory() -> str:
    with open("/proc/meminfo") as f:
        total = next(line for line in f if line.startswith("MemTotal"))
    return f"{int(total.split()[1]) / (1 << 20):.1f} GiB"


def package_versions() -> list[tuple[str, str]]:
    rows = []
    for name in PACKAGES:
        try:
            rows.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return rows


def torch_info() -> list[tuple[str, str]]:
    import torch
    rows = [("torch", torch.__version__), ("torch CUDA", str(torch.version.cuda)),
            ("torch threads", str(torch.get_num_threads()))]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        rows.append(("CUDA devices", "; ".join(names)))
    return rows


def vllm_info() -> list[tuple[str, str]]:
    from vllm.platforms import current_platform, resolve_current_platform_cls_qualname
    from vllm.version import __version__
    rows = [("vLLM", __version__), ("platform", resolve_current_platform_cls_qualname()),
            ("device type", current_platform.device_type)]
    fake = getattr(current_platform, "is_fake", None)
    if fake is not None:
        rows.append(("fake HPU", str(fake)))
    return rows


def gaudi_info() -> list[tuple[str, str]]:
    """The Gaudi driver and cards, from hl-smi where it is installed."""
    smi = shutil.which("hl-smi")
    if smi is None:
        return [("hl-smi", "not installed (no Gaudi driver on this machine)")]
    out = subprocess.run([smi, "-Q", "driver_version,name,memory.total", "-f", "csv"],
                         capture_output=True, text=True, timeout=20)
    lines = [line for line in out.stdout.splitlines()[1:] if line.strip()]
    return [("Gaudi devices", "; ".join(lines) or out.stderr.strip() or "none")]


def environment() -> list[tuple[str, str]]:
    """The variables as given (listed, not parsed: vllm/envs.py parses what it reads)."""
    return [(name, "***" if SECRET.search(name) else value)
            for name, value in sorted(os.environ.items()) if name.startswith(ENV_PREFIXES)]


def report() -> str:
    sections = {
        "System": [("OS", _probe(platform.platform)), ("CPU", _probe(cpu_model)),
                   ("CPU instruction sets", _probe(cpu_flags)),
                   ("cores", str(os.cpu_count())), ("memory", _probe(memory)),
                   ("Python", sys.version.split()[0])],
        "vLLM": _rows(vllm_info),
        "torch": _rows(torch_info),
        "Gaudi": _rows(gaudi_info),
        "Packages": _rows(package_versions),
        "Environment variables": _rows(environment),
    }
    lines = []
    for title, rows in sections.items():
        lines.append(f"===== {title} =====")
        lines += [f"{key}: {value}" for key, value in rows] or ["(none)"]
        lines.append("")
    return "\n".join(lines)


def _rows(fn: Callable[[], list[tuple[str, str]]]) -> list[tuple[str, str]]:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a report line, never a crash
        return [("error", f"could not collect ({type(e).__name__}: {e})")]


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()
