"""The operator split of profile_compare.py (benchmarks/_op_profile.py)."""
from __future__ import annotations

import pytest

from benchmarks._op_profile import CATEGORIES, categorize, profile_call, summarize


@pytest.mark.parametrize("name,category", [
    ("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("mkldnn::_linear_pointwise", "gemm"),
    ("_C::onednn_mm", "gemm"), ("native::gemm_bf16_packed", "gemm"), ("native::linear", "gemm"),
    ("_C::cpu_attention_with_kv_cache", "attention"), ("native::decode_attention", "attention"),
    ("native::write_kv", "attention"), ("_C::cpu_attn_reshape_and_cache", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("native::fused_decode_layers", "fused_layer"), ("aten::argmax", "sampling"),
    ("_C::greedy_argmax", "sampling"), ("aten::sort", "sampling"),
    ("## Call CompiledFxGraph None ##", "compiled"), ("Torch-Compiled Region: 0/0", "compiled"),
    ("native::rms_norm", "other_ops"), ("aten::copy_", "other_ops"), ("aten::empty", "other_ops"),
])
def test_categorize(name, category):
    assert categorize(name) == category


def test_buckets_and_host_add_up_to_the_wall_time():
    events = [("aten::mm", 0.5, 10), ("native::decode_attention", 0.2, 4), ("aten::add", 0.1, 3)]
    out = summarize(events, wall_s=1.0)
    assert out["seconds"]["gemm"] == 0.5 and out["seconds"]["attention"] == 0.2
    assert out["seconds"]["host"] == pytest.approx(0.2)
    assert sum(out["seconds"].values()) == pytest.approx(1.0)
    assert set(out["seconds"]) == {*CATEGORIES, "host"}
    assert [op["name"] for op in out["top_ops"]] == ["aten::mm", "native::decode_attention",
                                                     "aten::add"]


def test_profile_call_sees_torch_operators():
    import torch
    a = torch.randn(64, 64)
    result, prof = profile_call(lambda: (a @ a).sum())
    assert result.shape == ()
    assert prof["seconds"]["gemm"] > 0
    assert any(op["name"] == "aten::mm" for op in prof["top_ops"])
