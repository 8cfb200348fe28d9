"""benchmark_prefill_kernel.py: every kind this machine has runs, and the flash kinds
attend like SDPA on the benchmark's own inputs."""
from __future__ import annotations

import pytest
import torch

from benchmarks import benchmark_prefill_kernel as bench
from vllm.cpu import cpu_ops, prefill_ops

pytestmark = pytest.mark.skipif(
    prefill_ops.get_prefill_lib() is None or cpu_ops.get_native_lib() is None,
    reason="native kernels unavailable")


def test_kinds_follow_the_library_and_agree():
    out = torch.empty(40, 6 * 64, dtype=torch.bfloat16)
    fns = bench.runners(40, 6, 2, 64, torch.bfloat16, out)
    expected = {"flash-f32", "rowwise", "sdpa"}
    if prefill_ops.best_bf16_kernel() >= prefill_ops.DOT:
        expected.add("flash-dot")
    if prefill_ops.best_bf16_kernel() >= prefill_ops.AMX:
        expected.add("flash-amx")
    assert set(fns) == expected
    results = {}
    for name, fn in fns.items():
        out.fill_(float("nan"))
        fn()
        results[name] = out.float().clone()
    for name, got in results.items():
        torch.testing.assert_close(got, results["sdpa"], atol=2e-2, rtol=2e-2, msg=name)
    times = bench.time_interleaved(fns, reps=2, calls=1)
    assert set(times) == expected and all(t > 0 for t in times.values())
