"""`vllm.utils.compile_markers.assume_constant_result` marks a function the way torch's
decorator does, without importing torch._dynamo: the native CPU ops import without it,
and torch.compile still takes the marked function's result as a constant."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

from vllm.utils import compile_markers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh():
    def probe() -> bool:
        return True
    return probe


def test_the_marker_is_the_one_torch_sets(monkeypatch):
    theirs = torch.compiler.assume_constant_result(_fresh())
    monkeypatch.delitem(sys.modules, "torch._dynamo")  # as before dynamo is imported
    ours = compile_markers.assume_constant_result(_fresh())
    assert vars(ours) == vars(theirs) == {compile_markers.CONSTANT_RESULT_MARKER: True}


def test_native_ops_import_without_dynamo():
    code = ("import sys, vllm.cpu.ops, vllm.cpu.cpu_ops; "
            "print('torch._dynamo' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split()[-1:] == ["False"], out.stdout + out.stderr


def test_compile_treats_a_marked_result_as_a_constant():
    """A foreign C call breaks a full graph, unless its function is marked (as the
    native ops' `_lib_loaded` is)."""
    libc = ctypes.CDLL(None)

    def compiled(probe):
        @torch.compile(backend="eager", fullgraph=True)
        def f(x: torch.Tensor) -> torch.Tensor:
            return x + 1 if probe() else x - 1
        return f

    def unmarked() -> bool:
        return libc.getpid() > 0

    def marked() -> bool:
        return libc.getpid() > 0

    with pytest.raises(Exception, match="(?i)unsupported|graph break"):
        compiled(unmarked)(torch.zeros(3))
    marked = compile_markers.assume_constant_result(marked)
    assert torch.equal(compiled(marked)(torch.zeros(3)), torch.ones(3))
