"""Constructing a platform imports no kernels and starts no thread (issue 45, item 5).

A process that only reads its platform (a server's frontend, building the config) must
stay light and safe to fork: the kernels (CustomOp forwards, the kernel table) bind and
the CPU's native libraries build in the worker's device initialization
(`Platform.prepare_kernels`), or when the first layer is built. Each platform is built
in a fresh interpreter, and what its construction added to `sys.modules` and to
`threading.enumerate()` (and to the OS threads of the process) is checked.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLATFORMS = {
    "cpu": ("vllm.cpu.platform", "CpuPlatform", {}),
    "hpu": ("vllm.hpu.platform", "HpuPlatform", {"VLLM_USE_FAKE_HPU": "1"}),
    "cuda": ("vllm.platforms.cuda", "CudaPlatform", {}),
}

KERNEL_MODULES = ("vllm.model_executor", "vllm.attention", "vllm.sample", "vllm.cpu.ops",
                  "vllm.cpu.cpu_ops", "vllm.cpu.gemm", "vllm.cpu.loader", "vllm.hpu.ops",
                  "vllm.cuda.ops", "vllm.cuda.layer_kernels", "vllm.worker")
"""Op tables, kernels and model code: none may be imported by building a platform."""

_PROBE = """
import json, os, sys, threading
import importlib
module = importlib.import_module(sys.argv[1])
cls = getattr(module, sys.argv[2])
before, threads = set(sys.modules), len(os.listdir("/proc/self/task"))
platform = cls()
print(json.dumps({
    "imported": sorted(set(sys.modules) - before),
    "threads": [t.name for t in threading.enumerate()],
    "os_threads": len(os.listdir("/proc/self/task")) - threads,
}))
"""


def _construct(name: str) -> dict:
    module, cls, extra_env = PLATFORMS[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(extra_env, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", _PROBE, module, cls], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_constructing_a_platform_imports_no_kernels_and_starts_no_thread(name):
    found = _construct(name)
    kernels = [m for m in found["imported"]
               if any(m == k or m.startswith(k + ".") for k in KERNEL_MODULES)]
    assert not kernels, f"{name}: building the platform imported {kernels}"
    assert found["threads"] == ["MainThread"], found["threads"]
    assert found["os_threads"] <= 0, f"{name}: {found['os_threads']} new OS threads"


def test_the_probe_sees_what_a_kernel_binding_imports():
    """The check can fail: binding the CPU's kernels (what the worker does) imports the
    op table and model code."""
    code = ("import json, sys\nfrom vllm.cpu.platform import CpuPlatform\n"
            "before = set(sys.modules)\nCpuPlatform().bind_custom_ops()\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert "vllm.cpu.ops" in imported and "vllm.model_executor.custom_op" in imported
