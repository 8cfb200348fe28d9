"""The fake habana_frameworks shim and the HPU platform."""
from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vllm.hpu import habana

pytestmark = pytest.mark.skipif(not habana.is_fake_hpu(), reason="checks the fake HPU")


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, scale=1.0, meta=None):
        out = self.proj(x) * scale
        return out if meta is None else out + meta.bias.sum()


@dataclass
class _Meta:
    bias: torch.Tensor


def test_fake_graph_counts_captures_and_replays():
    habana.reset_compile_stats()
    model = habana.wrap_in_hpu_graph(_Linear(), disable_tensor_cache=True)
    x2, x3 = torch.randn(2, 4), torch.randn(3, 4)
    expected = model.proj(x2)
    out = model(x2)
    model(torch.randn(2, 4))
    model(x3)
    stats = habana.graph_stats(model)
    assert torch.allclose(out, expected)
    assert (stats.captures, stats.replays) == (2, 1)
    assert habana.compile_count() == 2
    model(torch.zeros(3, 4))  # same shape and dtype, other values: replay
    assert (stats.captures, stats.replays) == (2, 2)
    model.proj.double()
    model(x2.double())  # a new dtype is a new graph
    assert stats.captures == 3
    model.proj.float()
    # Tensors inside dataclasses are keyed by shape.
    model(x2, meta=_Meta(torch.zeros(5)))
    model(x2, meta=_Meta(torch.ones(5)))
    model(x2, meta=_Meta(torch.ones(6)))
    assert stats.captures == 5


def test_varying_scalars_make_new_graphs():
    model = habana.wrap_in_hpu_graph(_Linear())
    x = torch.randn(2, 4)
    for s in (1.0, 2.0, 3.0):
        model(x, scale=s)
    assert habana.graph_stats(model).captures == 3


def test_bypass_does_not_capture():
    model = habana.wrap_in_hpu_graph(_Linear())
    before = habana.compile_count()
    out = model(torch.randn(7, 4), bypass_hpu_graphs=True)
    stats = habana.graph_stats(model)
    assert out.shape == (7, 4)
    assert (stats.captures, stats.replays, stats.bypassed) == (0, 0, 1)
    assert habana.compile_count() == before
    with pytest.raises(ValueError):
        habana.graph_stats(_Linear())


def test_graph_captures_hold_fake_memory():
    habana.reset_tracked_memory()
    model = habana.wrap_in_hpu_graph(_Linear())
    model(torch.randn(256, 4))
    stats = habana.graph_stats(model)
    assert stats.captured_bytes() == 256 * 4 * 4 == habana.tracked_bytes()
    stats.release()
    assert habana.tracked_bytes() == 0
    model(torch.randn(256, 4))
    assert stats.captures == 2  # captured again after release
    habana.reset_tracked_memory()


def test_mem_get_info_honours_env_and_ledger(monkeypatch):
    habana.reset_tracked_memory()
    monkeypatch.setenv("VLLM_FAKE_HPU_MEMORY_GB", "2")
    assert habana.mem_get_info() == (2 << 30, 2 << 30)
    habana.track_alloc(1 << 30)
    t = torch.zeros(1024, 256)  # 1 MiB
    habana.track_alloc(t)
    habana.track_alloc(t)  # tracking a tensor twice counts it once
    assert habana.mem_get_info() == ((1 << 30) - (1 << 20), 2 << 30)
    del t
    gc.collect()
    assert habana.mem_get_info()[0] == 1 << 30  # released with the tensor
    habana.track_free(1 << 30)
    u = torch.zeros(256)
    habana.track_alloc(u)
    assert habana.track_free(u) == 1024 and habana.tracked_bytes() == 0
    monkeypatch.setenv("VLLM_FAKE_HPU_MEMORY_GB", "0")
    with pytest.raises(ValueError, match="VLLM_FAKE_HPU_MEMORY_GB"):
        habana.mem_get_info()


def test_metric_localcontext_counts_compiles():
    with habana.metric_localcontext("graph_compilation") as gc_metric:
        habana.record_compile(("test-shape", 1))
        habana.record_compile(("test-shape", 1))
        habana.record_compile(("test-shape", 2))
    assert gc_metric.stats()[0] == ("TotalNumber", 2)
    with habana.metric_localcontext("cpu_fallback") as fb:
        pass
    assert fb.stats()[0] == ("TotalNumber", None)  # not countable off hardware
    with pytest.raises(ValueError):
        with habana.metric_localcontext("bogus"):
            pass


def test_device_stand_ins(monkeypatch):
    steps = habana.mark_step_count()
    habana.mark_step()
    assert habana.mark_step_count() == steps + 1
    habana.synchronize()
    monkeypatch.setenv("VLLM_FAKE_HPU_DEVICE_COUNT", "2")
    monkeypatch.setenv("VLLM_FAKE_HPU_MEMORY_GB", "4,2")
    try:
        habana.set_device(1)
        assert habana.current_device() == 1
        assert habana.mem_get_info()[1] == 2 << 30  # the current device's own size
        habana.set_device(torch.device("hpu"))  # no index: device 0
        assert habana.current_device() == 0 and habana.mem_get_info()[1] == 4 << 30
        with pytest.raises(ValueError, match="VLLM_FAKE_HPU_DEVICE_COUNT"):
            habana.set_device(2)
        monkeypatch.setenv("VLLM_FAKE_HPU_DEVICE_COUNT", "3")
        habana.set_device(2)
        with pytest.raises(ValueError, match="lists 2 devices; device index 2"):
            habana.mem_get_info()
    finally:
        habana.set_device(0)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert habana.is_lazy()
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert not habana.is_lazy()


def _reference_sdpa(q, k, v, lens, causal, left=False):
    b, h, t, d = q.shape
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    out = torch.zeros_like(q)
    for i in range(b):
        n = int(lens[i])
        sl = slice(t - n, t) if left else slice(0, n)
        s = q[i, :, sl] @ k[i, :, sl].transpose(-1, -2) / d ** 0.5
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out[i, :, sl] = s.softmax(-1) @ v[i, :, sl]
    return out


@pytest.mark.parametrize("side", ["right", "left"])
def test_fused_sdpa_valid_lengths_and_gqa(side):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 6, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    lens = torch.tensor([6, 2, 0])
    out = habana.FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", False, lens, side)
    ref = _reference_sdpa(q, k, v, lens, True, left=side == "left")
    assert (out - ref).abs().max() < 1e-5
    plain = habana.FusedSDPA.apply(q, k, v, None, 0.0, False, None, "None", False, None, side)
    assert torch.allclose(plain, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    with pytest.raises(ValueError, match="padding_side"):
        habana.FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", False, lens, "middle")


def test_fused_rms_norm():
    x, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(16)
    out = habana.FusedRMSNorm.apply(x, w, 1e-6)
    xf = x.float()
    ref = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref, atol=2e-2, rtol=1e-2)


def test_rotary_modes():
    torch.manual_seed(0)
    x = torch.randn(5, 2, 8)  # [tokens, heads, head_dim]
    angles = torch.randn(5, 1, 2)  # 2 frequencies for a rotary width of 4
    cos_b = torch.cat([angles.cos(), angles.cos()], -1)
    sin_b = torch.cat([angles.sin(), angles.sin()], -1)
    out = habana.apply_rotary_pos_emb(x, cos_b, sin_b)  # BLOCKWISE, partial rotary (4 of 8)
    a, b = x[..., :2], x[..., 2:4]
    assert torch.allclose(out[..., :2], a * angles.cos() - b * angles.sin(), atol=1e-6)
    assert torch.allclose(out[..., 2:4], b * angles.cos() + a * angles.sin(), atol=1e-6)
    assert torch.equal(out[..., 4:], x[..., 4:])
    cos_p = angles.cos().repeat_interleave(2, -1)
    sin_p = angles.sin().repeat_interleave(2, -1)
    out_p = habana.apply_rotary_pos_emb(x, cos_p, sin_p, None, 0,
                                     habana.RotaryPosEmbeddingMode.PAIRWISE)
    e, o = x[..., 0:4:2], x[..., 1:4:2]
    assert torch.allclose(out_p[..., 0:4:2], e * angles.cos() - o * angles.sin(), atol=1e-6)
    assert torch.allclose(out_p[..., 1:4:2], o * angles.cos() + e * angles.sin(), atol=1e-6)
    with pytest.raises(ValueError, match="offset=0"):
        habana.apply_rotary_pos_emb(x, cos_p, sin_p, None, 3)


def test_hpu_platform(monkeypatch):
    from vllm.hpu.platform import HpuPlatform
    p = HpuPlatform()
    assert p.is_hpu() and p.device_name == "hpu" and p.device_type == "hpu"
    assert p.torch_device == "cpu" and p.dist_backend == "gloo"
    assert p.default_block_size() == 128
    assert p.resolve_auto_dtype(torch.float16) == torch.bfloat16
    assert p.resolve_auto_dtype(torch.float32) == torch.bfloat16
    assert p.get_worker_cls() == "vllm.hpu.worker.HPUWorker"
    assert p.get_attn_backend_cls() == "vllm.hpu.attention.HPUAttentionImpl"
    monkeypatch.setenv("VLLM_FAKE_HPU_MEMORY_GB", "3")
    habana.reset_tracked_memory()
    assert p.mem_get_info() == (3 << 30, 3 << 30)


def test_platform_detection(monkeypatch):
    from vllm import platforms
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "hpu")
    for name in ("PT_HPU_WEIGHT_SHARING", "RUNTIME_SCALE_PATCHING"):  # the platform sets
        monkeypatch.setenv(name, "unset")                             # them: undo after
        monkeypatch.delenv(name)
    monkeypatch.setattr(torch._dynamo.config, "disable", torch._dynamo.config.disable)
    platforms._reset_current_platform()
    try:
        assert platforms.current_platform.is_hpu()
        assert platforms.current_platform.torch_device == "cpu"
    finally:
        platforms._reset_current_platform()
