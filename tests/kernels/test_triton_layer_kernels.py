"""The CUDA platform's Triton kernels of RMSNorm, SiLU-and-mul and the rotary
embedding against the layers' own torch forwards (`forward_native`), on CPU through
Triton's interpreter (the code a GPU compiles); with VLLM_TEST_TRITON_DEVICE=cuda on a
GPU. Float32 must agree to float32 rounding; bfloat16 within two bfloat16 steps (the
kernels round where transformers does, e.g. RMSNorm's `x * rstd` before the weight,
where torch's fused op rounds once)."""
from __future__ import annotations

import os

import pytest
import torch

from vllm.attention.ops.triton_reshape_and_cache import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

DEVICE = os.environ.get("VLLM_TEST_TRITON_DEVICE", "cpu")

if HAS_TRITON:
    from vllm.cuda import layer_kernels, ops
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding import get_rope


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    if want.dtype == torch.float32:
        atol, rtol = 1e-6, 1e-6
    else:
        atol, rtol = 1e-2, 2 ** -6
    torch.testing.assert_close(got.cpu().float(), want.cpu().float(), atol=atol, rtol=rtol)


@pytest.fixture(params=[torch.float32, torch.bfloat16])
def dtype(request):
    return request.param


def _norm(hidden: int, dtype: torch.dtype) -> "RMSNorm":
    norm = RMSNorm(hidden, eps=1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden) + 0.5)
    return norm


@pytest.mark.parametrize("hidden", [64, 100, 2048])
def test_rms_norm(dtype, hidden):
    norm = _norm(hidden, dtype)
    x = torch.randn(5, hidden).to(DEVICE, dtype) * 3
    _close(ops.rms_norm_cuda(norm, x.clone()), norm.forward_native(x.clone()))


def test_rms_norm_with_residual_works_in_place(dtype):
    """The residual becomes the sum and x its norm (vLLM's fused_add_rms_norm), also
    for rows that are strided views (a fused projection's output)."""
    norm = _norm(96, dtype)
    wide = torch.randn(4, 160).to(DEVICE, dtype)
    x, residual = wide[:, :96], torch.randn(4, 96).to(DEVICE, dtype)
    want_out, want_res = norm.forward_native(x.clone(), residual.clone())
    x_in, res_in = x.clone(), residual.clone()
    out, res = ops.rms_norm_cuda(norm, x_in, res_in)
    assert out is x_in and res is res_in
    _close(res, want_res)
    _close(out, want_out)
    strided = wide.clone()
    out, _ = ops.rms_norm_cuda(norm, strided[:, :96], residual.clone())
    _close(out, want_out)
    assert torch.equal(strided[:, 96:], wide[:, 96:])  # the rest of the rows untouched


@pytest.mark.parametrize("d", [48, 1536])
def test_silu_and_mul(dtype, d):
    x = (torch.randn(3, 2 * d) * 4).to(DEVICE, dtype)
    _close(ops.silu_and_mul_cuda(SiluAndMul(), x), SiluAndMul().forward_native(x))


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rot_dim", [64, 32])  # 32: partial rotary, the tail untouched
def test_rotary_in_place_on_fused_qkv_views(dtype, neox, rot_dim):
    head, num_q, num_kv, tokens = 64, 4, 2, 6
    rope = get_rope(head, rot_dim, 512, 10000.0, is_neox_style=neox, dtype=dtype).to(DEVICE)
    qkv = torch.randn(tokens, (num_q + 2 * num_kv) * head).to(DEVICE, dtype)
    positions = torch.tensor([0, 1, 7, 100, 511, 3], device=DEVICE)
    q, k = qkv[:, :num_q * head], qkv[:, num_q * head:(num_q + num_kv) * head]
    want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
    v_before = qkv[:, (num_q + num_kv) * head:].clone()
    got_q, got_k = ops.rotary_embedding_cuda(rope, positions, q, k)
    assert got_q.data_ptr() == q.data_ptr()  # in place
    _close(got_q, want_q)
    _close(got_k, want_k)
    assert torch.equal(qkv[:, (num_q + num_kv) * head:], v_before)


def test_fallbacks_keep_the_torch_forward(monkeypatch):
    """Where a kernel does not apply (3-D rows, a cache in another dtype than the
    activations, M-RoPE's position rows) the layer's own forward runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("the kernel should not run here")
    for name in ("rms_norm", "silu_and_mul", "rotary_qk_"):
        monkeypatch.setattr(layer_kernels, name, refuse)
    norm = _norm(32, torch.float32)
    x = torch.randn(2, 3, 32, device=DEVICE)
    _close(ops.rms_norm_cuda(norm, x), norm.forward_native(x))
    _close(ops.silu_and_mul_cuda(SiluAndMul(), x), SiluAndMul().forward_native(x))
    rope = get_rope(16, 16, 64, 10000.0, dtype=torch.bfloat16).to(DEVICE)
    q, k = torch.randn(3, 32, device=DEVICE), torch.randn(3, 16, device=DEVICE)
    positions = torch.tensor([1, 2, 3], device=DEVICE)
    got, want = (ops.rotary_embedding_cuda(rope, positions, q.clone(), k.clone()),
                 rope.forward_native(positions, q.clone(), k.clone()))
    _close(got[0], want[0])
    rope32 = get_rope(16, 16, 64, 10000.0, dtype=torch.float32).to(DEVICE)
    with pytest.raises(Exception) as raised:  # [3, T] positions reach forward_native,
        ops.rotary_embedding_cuda(rope32, positions.repeat(3, 1), q, k)  # which refuses
    assert not isinstance(raised.value, AssertionError)  # not the kernel


def test_the_cuda_platform_binds_them():
    from vllm.model_executor.custom_op import CustomOp
    from vllm.platforms.cuda import CudaPlatform
    CudaPlatform().bind_custom_ops()
    for name, fn in ops.CUDA_FORWARDS.items():
        assert CustomOp.entry(name).forwards["cuda"] is fn


def test_launches_compile_for_sm90(monkeypatch):
    """Compile every launch of the three ops for sm_90 ahead of time (no GPU needed)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tests.kernels.test_triton_attention import _compile_for_sm90, _Recorder
    recorders = {}
    for name in ("_RMS_NORM", "_SILU_AND_MUL", "_ROTARY"):
        recorders[name] = _Recorder(getattr(layer_kernels, name))
        monkeypatch.setattr(layer_kernels, name, recorders[name])
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.zeros(4, 2048, dtype=dtype)
        layer_kernels.rms_norm(x, torch.ones(2048, dtype=dtype), 1e-6)
        layer_kernels.rms_norm(x, torch.ones(2048, dtype=dtype), 1e-6, torch.zeros_like(x))
        layer_kernels.silu_and_mul(torch.zeros(4, 2 * 8192, dtype=dtype))
        for neox in (True, False):
            layer_kernels.rotary_qk_(torch.zeros(4, dtype=torch.long),
                                     torch.zeros(4, 32, 128, dtype=dtype),
                                     torch.zeros(4, 8, 128, dtype=dtype),
                                     torch.zeros(64, 128, dtype=dtype), 128, neox)
    launches = [launch for r in recorders.values() for launch in r.launches]
    assert len(launches) == 10
    for fn, args, kwargs in launches:
        _compile_for_sm90(fn, args, dict(kwargs))
