"""The CUDA fp8 GEMM (`torch._scaled_mm`, fp8_scaled_mm.py) checked on CPU.

`_scaled_mm` also runs on CPU in this torch, so the CUDA path's function is called
directly on CPU tensors and compared with a float64 dequantized reference and with
the CPU path (the CPU's `fp8_gemm` kernel, vllm/cpu/ops.py). fp8 products are exact in float32, so the paths
differ only in summation order and the final rounding to the output dtype; the
tolerance is a few output ulps of the result's magnitude.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vllm.model_executor.layers.quantization import fp8_utils
from vllm.model_executor.layers.quantization.fp8_scaled_mm import (Fp8GemmPlan,
                                                                   plan_fp8_gemm,
                                                                   scaled_mm_fp8_gemm,
                                                                   scaled_mm_supported)
from vllm.model_executor.layers.quantization.fp8_utils import (FP8_DTYPE, fp8_linear,
                                                               per_token_fp8,
                                                               quantize_weight, scaled_fp8)

HOPPER, ADA, AMPERE = (9, 0), (8, 9), (8, 0)
_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _weight(n: int, k: int, per_channel: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.linspace(0.1, 2.0, n).unsqueeze(1)
    return quantize_weight(w, per_channel)


def _activations(m: int, k: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen) * 3).to(dtype)


def _quantize(x: torch.Tensor, static_scale):
    if static_scale is None:
        return per_token_fp8(x)
    scale = torch.tensor([[static_scale]], dtype=torch.float32)
    return scaled_fp8(x, scale), scale


def _reference(x_q, x_scale, w_q, w_scale, bias) -> torch.Tensor:
    """The product in float64 from the dequantized operands."""
    x = x_q.double() * x_scale.double().reshape(-1, 1)
    w = w_q.double() * w_scale.double().reshape(-1, 1)
    out = x @ w.T
    return out if bias is None else out + bias.double()


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and out.shape == ref.shape
    err = (out.double() - ref).abs().max().item()
    assert err <= _TOL[dtype] * max(1.0, ref.abs().max().item()), err


@pytest.mark.parametrize("capability", [HOPPER, ADA])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("static_scale", [None, 0.05])
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_matches_reference_and_cpu_path(capability, dtype, per_channel,
                                                  static_scale, m, with_bias):
    n, k = 48, 64
    w_q, w_scale = _weight(n, k, per_channel)
    plan = plan_fp8_gemm(capability, w_q, w_scale)
    assert plan.use_scaled_mm and plan.per_tensor_weight == (not per_channel)
    x_q, x_scale = _quantize(_activations(m, k, dtype), static_scale)
    bias = (torch.randn(n) * 0.5).to(dtype) if with_bias else None
    out = scaled_mm_fp8_gemm(x_q, x_scale, w_q, w_scale, bias, dtype, plan)
    ref = _reference(x_q, x_scale, w_q, w_scale, bias)
    _close(out, ref, dtype)
    from vllm.cpu.ops import fp8_gemm_cpu
    cpu = fp8_gemm_cpu(x_q, x_scale, w_q, w_scale, bias, dtype)
    _close(out, cpu.double(), dtype)


def test_each_scale_mode_reaches_its_scaled_mm_call(monkeypatch):
    """Tensor-wise scales are one element, row-wise [M, 1] / [1, N], and the unfused
    mode (Ada, or a non-bf16 output) asks for a float32 product with unit scales."""
    calls = []
    real = torch._scaled_mm

    def spy(a, b, **kw):
        calls.append((tuple(kw["scale_a"].shape), tuple(kw["scale_b"].shape),
                      kw["out_dtype"], kw.get("bias") is not None))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    n, k, m = 32, 32, 5
    x_q, tok_scale = _quantize(_activations(m, k, torch.bfloat16), None)
    static = torch.tensor([[0.1]])
    bias = torch.zeros(n, dtype=torch.bfloat16)
    w_t, s_t = _weight(n, k, per_channel=False)
    w_c, s_c = _weight(n, k, per_channel=True)
    hopper_t, hopper_c = plan_fp8_gemm(HOPPER, w_t, s_t), plan_fp8_gemm(HOPPER, w_c, s_c)
    scaled_mm_fp8_gemm(x_q, static, w_t, s_t, bias, torch.bfloat16, hopper_t)
    scaled_mm_fp8_gemm(x_q, tok_scale, w_c, s_c, bias, torch.bfloat16, hopper_c)
    scaled_mm_fp8_gemm(x_q, static, w_c, s_c, None, torch.bfloat16, hopper_c)
    scaled_mm_fp8_gemm(x_q, tok_scale, w_c, s_c, None, torch.bfloat16,
                       plan_fp8_gemm(ADA, w_c, s_c))
    scaled_mm_fp8_gemm(x_q, tok_scale, w_c, s_c, None, torch.float16, hopper_c)
    assert calls == [((), (), torch.bfloat16, True),
                     ((m, 1), (1, n), torch.bfloat16, True),
                     ((m, 1), (1, n), torch.bfloat16, False),
                     ((), (), torch.float32, False),
                     ((), (), torch.float32, False)]


@pytest.mark.parametrize("capability,expected", [(None, False), (AMPERE, False),
                                                 ((8, 6), False), (ADA, True),
                                                 (HOPPER, True), ((10, 0), True)])
def test_dispatch_by_capability(capability, expected):
    w_q, w_scale = _weight(32, 64, per_channel=True)
    plan = plan_fp8_gemm(capability, w_q, w_scale)
    assert plan.use_scaled_mm is expected
    assert plan.rowwise is (capability is not None and capability >= HOPPER)


@pytest.mark.parametrize("n,k", [(40, 64), (32, 72), (24, 24)])
def test_fallback_when_k_or_n_not_multiple_of_16(n, k):
    w_q, w_scale = _weight(n, k, per_channel=True)
    assert not scaled_mm_supported(HOPPER, k, n)
    plan = plan_fp8_gemm(HOPPER, w_q, w_scale)
    assert not plan.use_scaled_mm and "multiple of 16" in plan.reason


def test_fallback_for_non_fp8_weight():
    plan = plan_fp8_gemm(HOPPER, torch.zeros(32, 32, dtype=torch.bfloat16), torch.ones(32))
    assert not plan.use_scaled_mm


def test_per_tensor_detected_from_equal_channel_scales():
    """A per-tensor checkpoint scale arrives expanded per channel; equal values plan
    tensor-wise, one differing channel (merged q/k/v with their own scales) row-wise."""
    w_q = torch.zeros(32, 32).to(FP8_DTYPE)
    assert plan_fp8_gemm(HOPPER, w_q, torch.full((32,), 0.5)).per_tensor_weight
    parts = torch.cat([torch.full((16,), 0.5), torch.full((16,), 0.25)])
    assert not plan_fp8_gemm(HOPPER, w_q, parts).per_tensor_weight


@pytest.mark.parametrize("static_scale", [None, 0.05])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_linear_with_plan_matches_without(static_scale, per_channel):
    """fp8_linear takes the scaled_mm path when handed a scaled_mm plan, with the same
    activation quantization (dynamic per token, or the static scale) as today."""
    n, k = 48, 64
    w_q, w_scale = _weight(n, k, per_channel)
    x = _activations(6, k, torch.float32).reshape(2, 3, k)
    input_scale = None if static_scale is None else torch.tensor([static_scale])
    bias = torch.randn(n)
    plan = plan_fp8_gemm(HOPPER, w_q, w_scale)
    ours = fp8_linear(x, w_q, w_scale, input_scale, bias, None, plan)
    today = fp8_linear(x, w_q, w_scale, input_scale, bias)
    assert ours.shape == (2, 3, n)
    _close(ours, today.double(), torch.float32)


def test_fp8_linear_dequant_plan_keeps_cpu_path(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("_scaled_mm called for a dequantize plan")

    monkeypatch.setattr(torch, "_scaled_mm", forbidden)
    w_q, w_scale = _weight(32, 32, per_channel=True)
    plan = plan_fp8_gemm(AMPERE, w_q, w_scale)
    out = fp8_linear(torch.randn(3, 32), w_q, w_scale, None, None, None, plan)
    assert out.shape == (3, 32)


def test_linear_methods_plan_at_load_and_replan_when_moved(monkeypatch):
    """`process_weights_after_loading` plans once (CPU: dequantize); a planned layer is
    not planned again per call, one whose weight moved device is."""
    from vllm.model_executor.layers.quantization import fp8 as fp8_module
    planned = []
    real = fp8_module.plan_fp8_gemm

    def counting(capability, w_q, w_scale):
        planned.append(capability)
        return real(capability, w_q, w_scale)

    monkeypatch.setattr(fp8_module, "plan_fp8_gemm", counting)
    method = fp8_module.Fp8OnlineLinearMethod(per_channel=False)
    layer = nn.Module()
    layer.weight_loader = None
    method.part_sizes = [16, 16]
    layer.weight = nn.Parameter(torch.randn(32, 32), requires_grad=False)
    method.process_weights_after_loading(layer)
    assert planned == [None] and layer.fp8_gemm_plan.use_scaled_mm is False
    for _ in range(3):
        method.apply(layer, torch.randn(2, 32))
    assert planned == [None]
    layer.fp8_gemm_plan = Fp8GemmPlan(True, device=torch.device("meta"))
    method.apply(layer, torch.randn(2, 32))
    assert planned == [None, None] and layer.fp8_gemm_plan.device == torch.device("cpu")
