"""The native state-space decode steps (vllm/cpu/state_ops.cpp) against the torch ops:
the same outputs and, in place at the batch's slots, the same states; other slots
untouched; the CPU kernel table runs them and falls back to torch where they cannot."""
from __future__ import annotations

import pytest
import torch

from vllm.cpu import state_ops
from vllm.model_executor.layers.mamba import ops

pytestmark = pytest.mark.skipif(state_ops.get_state_lib() is None,
                                reason="native CPU kernels unavailable")


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, p, n, g", [(1, 4, 8, 16, 1), (3, 6, 5, 24, 2)])
def test_ssd_step_in_place_matches_torch(cache_dtype, b, h, p, n, g):
    torch.manual_seed(0)
    cache = torch.randn(9, h, p, n).to(cache_dtype)
    slots = torch.tensor([7, 2, 5][:b])
    x, dt, A = torch.randn(b, h, p).bfloat16(), torch.rand(b, h), -torch.rand(h)
    B, C, D = torch.randn(b, g, n), torch.randn(b, g, n), torch.randn(h)
    expected = cache.clone()
    y_ref, _ = ops.ssd_step(x, dt, A, B, C, D, expected, state_slots=slots)
    y, out = state_ops.ssd_step(x, dt, A, B, C, D, cache, state_slots=slots)
    assert out is cache and y.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    if cache_dtype == torch.bfloat16:  # float32 sums rounded once, as torch's .to()
        assert torch.equal(cache, expected)
    else:
        torch.testing.assert_close(cache, expected, rtol=1e-6, atol=1e-6)
    untouched = [i for i in range(9) if i not in slots.tolist()]
    assert torch.equal(cache[untouched], expected[untouched])


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_conv_step_in_place_matches_torch(cache_dtype):
    torch.manual_seed(1)
    b, c, k = 3, 20, 4
    cache = torch.randn(6, c, k - 1).to(cache_dtype)
    slots = torch.tensor([4, 0, 3])
    x, w, bias = torch.randn(b, c), torch.randn(c, k), torch.randn(c)
    expected = cache.clone()
    out_ref, _ = ops.causal_conv1d_step(x, w, bias, expected, state_slots=slots)
    out, state = state_ops.causal_conv1d_step(x, w, bias, cache, state_slots=slots)
    assert state is cache and out.dtype == x.dtype
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_gated_delta_step_in_place_matches_torch(cache_dtype):
    torch.manual_seed(3)
    b, h, dk, dv = 3, 2, 8, 6
    cache = torch.randn(5, h, dk, dv).to(cache_dtype)
    slots = torch.tensor([0, 4, 2])
    q, k = torch.randn(b, h, dk) * 0.3, torch.randn(b, h, dk) * 0.3
    v, g, beta = torch.randn(b, h, dv), -torch.rand(b, h), torch.rand(b, h)
    expected = cache.clone()
    o_ref, _ = ops.gated_delta_rule_step(q, k, v, g, beta, expected, state_slots=slots)
    o, out = state_ops.gated_delta_rule_step(q, k, v, g, beta, cache, state_slots=slots)
    assert out is cache
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.float(), expected.float(), rtol=1e-6,
                               atol=1e-6 if cache_dtype == torch.float32 else 1e-2)
    untouched = [i for i in range(5) if i not in slots.tolist()]
    assert torch.equal(cache[untouched], expected[untouched])


def test_cpu_table_runs_them_and_falls_back_to_torch():
    from vllm.cpu.ops import CPU_KERNELS
    assert CPU_KERNELS["ssd_step"] is state_ops.ssd_step
    assert CPU_KERNELS["causal_conv1d_step"] is state_ops.causal_conv1d_step
    assert CPU_KERNELS["gated_delta_rule_step"] is state_ops.gated_delta_rule_step
    # A float16 cache has no native path: the torch op runs, same contract.
    cache = torch.randn(4, 2, 3, 8).half()
    x, dt, A = torch.randn(1, 2, 3), torch.rand(1, 2), -torch.rand(2)
    B, C, D = torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.randn(2)
    expected = cache.clone()
    y_ref, _ = ops.ssd_step(x, dt, A, B, C, D, expected, state_slots=torch.tensor([1]))
    y, _ = state_ops.ssd_step(x, dt, A, B, C, D, cache, state_slots=torch.tensor([1]))
    assert torch.equal(y, y_ref) and torch.equal(cache, expected)
    # Without slots (a fresh state, the prefill's last step): the torch op.
    state = torch.randn(1, 2, 3, 8)
    y, new = state_ops.ssd_step(x, dt, A, B, C, D, state)
    y_ref, new_ref = ops.ssd_step(x, dt, A, B, C, D, state)
    assert torch.equal(y, y_ref) and torch.equal(new, new_ref)
