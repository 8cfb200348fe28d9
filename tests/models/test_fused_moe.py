"""FusedMoE against a per-token float64 reference; the HPU stand-in against the CPU path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm.hpu.habana.moe import fake_mixture_of_experts
from vllm.model_executor.layers.fused_moe import FusedMoE, expert_param_name, select_experts


def _reference(x, logits, w13, w2, top_k, renormalize):
    """Token by token, expert by expert, in float64."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    probs = torch.softmax(logits.double(), -1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        vals, ids = probs[t].topk(top_k)
        if renormalize:
            vals = vals / vals.sum()
        for v, e in zip(vals, ids):
            gate, up = (w13[e] @ x[t]).chunk(2)
            out[t] += v * (w2[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
def test_grouped_experts_match_per_token_reference(renormalize):
    torch.manual_seed(0)
    layer = FusedMoE(num_experts=6, top_k=2, hidden_size=32, intermediate_size=24,
                     renormalize=renormalize, params_dtype=torch.float32)
    layer.w13_weight.data.normal_(0, 0.3)
    layer.w2_weight.data.normal_(0, 0.3)
    x, logits = torch.randn(37, 32), torch.randn(37, 6)
    logits[:, 5] = -1e4  # an expert no token picks
    out = layer(x, logits)
    ref = _reference(x, logits, layer.w13_weight, layer.w2_weight, 2, renormalize)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    weights, ids = select_experts(logits, 2, renormalize)
    fake = fake_mixture_of_experts(x, ids, weights, list(layer.w13_weight),
                                   list(layer.w2_weight), experts_min=0, experts_max=5)
    torch.testing.assert_close(fake, out, atol=1e-6, rtol=1e-6)


def test_expert_weight_loading_and_names():
    layer = FusedMoE(num_experts=2, top_k=1, hidden_size=4, intermediate_size=6,
                     params_dtype=torch.float32)
    gate, up, down = torch.randn(6, 4), torch.randn(6, 4), torch.randn(4, 6)
    layer.weight_loader(layer.w13_weight, gate, "w1", 1)
    layer.weight_loader(layer.w13_weight, up, "w3", 1)
    layer.weight_loader(layer.w2_weight, down, "w2", 1)
    assert torch.equal(layer.w13_weight[1], torch.cat([gate, up]))
    assert torch.equal(layer.w2_weight[1], down)
    with pytest.raises(ValueError, match="shape mismatch"):
        layer.weight_loader(layer.w2_weight, torch.randn(4, 5), "w2", 0)
    assert expert_param_name("model.layers.3.mlp.experts.12.up_proj.weight") == (
        "model.layers.3.mlp.experts.w13_weight", ("w3", 12))
    assert expert_param_name("m.layers.0.block_sparse_moe.experts.1.w2.weight") == (
        "m.layers.0.block_sparse_moe.experts.w2_weight", ("w2", 1))
    assert expert_param_name("model.layers.0.mlp.shared_expert.up_proj.weight") is None


def test_bf16_packed_experts_match_plain_linear():
    from vllm.cpu.gemm import PACKS_ATTR, drop_packed_weights
    from vllm.cpu import cpu_ops
    if not cpu_ops.gemm_supported():
        pytest.skip("no native bf16 GEMM on this CPU")
    torch.manual_seed(0)
    layer = FusedMoE(num_experts=4, top_k=2, hidden_size=64, intermediate_size=96,
                     params_dtype=torch.bfloat16)
    layer.w13_weight.data.normal_(0, 0.1)
    layer.w2_weight.data.normal_(0, 0.1)
    x, logits = torch.randn(9, 64, dtype=torch.bfloat16), torch.randn(9, 4)
    with torch.no_grad():
        packed = layer(x, logits)
        assert PACKS_ATTR in layer.__dict__
        ref = _reference(x, logits, layer.w13_weight, layer.w2_weight, 2, True)
        torch.testing.assert_close(packed.double(), ref, atol=0.05, rtol=0.02)
        drop_packed_weights(layer)  # what load_weights does before new weights
        assert PACKS_ATTR not in layer.__dict__


def _swigluoai_reference(x, logits, layer, top_k, limit, alpha):
    """GPT-OSS's experts token by token in float64: top-k of the logits, softmax over the
    k, biases, the clamped (up + 1) * gate * sigmoid(alpha * gate)."""
    x = x.double()
    w13, w2 = layer.w13_weight.double(), layer.w2_weight.double()
    b13, b2 = layer.w13_bias.double(), layer.w2_bias.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        vals, ids = logits[t].double().topk(top_k)
        for v, e in zip(torch.softmax(vals, 0), ids):
            gate, up = (w13[e] @ x[t] + b13[e]).chunk(2)
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            out[t] += v * (w2[e] @ ((up + 1) * gate * torch.sigmoid(alpha * gate)) + b2[e])
    return out


def _swigluoai_layer(dtype=torch.float32, **kw):
    torch.manual_seed(0)
    layer = FusedMoE(num_experts=5, top_k=2, hidden_size=32, intermediate_size=24,
                     params_dtype=dtype, activation="swigluoai", has_bias=True,
                     swiglu_limit=1.5, **kw)
    for p in (layer.w13_weight, layer.w2_weight, layer.w13_bias, layer.w2_bias):
        p.data.normal_(0, 0.5)
    return layer


def test_swigluoai_with_biases_matches_reference_and_dense_experts():
    """The GPT-OSS activation (limit small enough that the clamps bite) with expert
    biases: the grouped torch path against the reference, and the HPU's static-shape
    `dense_experts` against the grouped path."""
    layer = _swigluoai_layer()
    assert layer.needs_dense_experts
    x, logits = torch.randn(23, 32), torch.randn(23, 5)
    logits[:, 4] = -1e4  # an expert no token picks
    out = layer(x, logits)
    ref = _swigluoai_reference(x, logits, layer, 2, 1.5, 1.702)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    weights, ids = select_experts(logits, 2, True)
    torch.testing.assert_close(layer.dense_experts(x, weights, ids), out, atol=1e-6,
                               rtol=1e-6)
    with pytest.raises(ValueError, match="activation"):
        FusedMoE(num_experts=2, top_k=1, hidden_size=4, intermediate_size=4,
                 activation="gelu")


def test_swigluoai_bf16_packed_experts_with_biases():
    from vllm.cpu import cpu_ops
    if not cpu_ops.gemm_supported():
        pytest.skip("no native bf16 GEMM on this CPU")
    from vllm.cpu.ops import fused_moe_cpu
    layer = _swigluoai_layer(torch.bfloat16)
    x, logits = torch.randn(9, 32, dtype=torch.bfloat16), torch.randn(9, 5)
    with torch.no_grad():
        out = fused_moe_cpu(layer, x, logits)
    ref = _swigluoai_reference(x, logits, layer, 2, 1.5, 1.702)
    torch.testing.assert_close(out.double(), ref, atol=0.1, rtol=0.05)


def test_expert_bias_loading_per_tp_rank():
    """Each rank takes its slice of the gate and up biases; only the first rank of the
    expert's TP group keeps the down bias (the all-reduce adds it once)."""
    gate_b, up_b, down_b = torch.randn(6), torch.randn(6), torch.randn(4)
    for rank in (0, 1):
        layer = FusedMoE(num_experts=2, top_k=1, hidden_size=4, intermediate_size=6,
                         params_dtype=torch.float32, has_bias=True)
        layer.moe_tp_size, layer.moe_tp_rank = 2, rank  # as a TP=2 rank sees it
        layer.intermediate_size_per_partition = 3
        layer.w13_bias.data = torch.zeros(2, 6)
        layer.weight_loader(layer.w13_bias, gate_b, "w1", 1)
        layer.weight_loader(layer.w13_bias, up_b, "w3", 1)
        layer.weight_loader(layer.w2_bias, down_b, "w2", 1)
        assert torch.equal(layer.w13_bias[1], torch.cat([gate_b[3 * rank:3 * rank + 3],
                                                         up_b[3 * rank:3 * rank + 3]]))
        assert torch.equal(layer.w2_bias[1], down_b if rank == 0 else torch.zeros(4))
        with pytest.raises(ValueError, match="shape mismatch"):
            layer.weight_loader(layer.w2_bias, torch.randn(5), "w2", 0)
