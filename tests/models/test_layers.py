"""Layer-level checks: rotary at arbitrary positions, norms, sharded weight loading."""
from __future__ import annotations

import pytest
import torch

from vllm.model_executor.layers import linear as linear_mod
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.cpu import cpu_ops


def _hf_rotary(config, positions, q, k, head_dim):
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)
    rope = LlamaRotaryEmbedding(config)
    cos, sin = rope(q, positions[None])
    t = positions.numel()
    q4 = q.view(1, t, -1, head_dim).transpose(1, 2)
    k4 = k.view(1, t, -1, head_dim).transpose(1, 2)
    q_out, k_out = apply_rotary_pos_emb(q4, k4, cos, sin)
    return q_out.transpose(1, 2).reshape(t, -1), k_out.transpose(1, 2).reshape(t, -1)


@pytest.mark.parametrize("rope", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
])
def test_rotary_matches_transformers_at_any_position(rope):
    import transformers
    head_dim, theta = 64, 500000.0
    params = {"rope_type": "default", **(rope or {}), "rope_theta": theta}
    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=4096,
                                      rope_parameters=params)
    positions = torch.tensor([0, 5, 4095, 17, 1000, 3])  # decode-like, unordered
    q, k = torch.randn(6, 4 * head_dim), torch.randn(6, 2 * head_dim)
    ref = _hf_rotary(config, positions, q, k, head_dim)
    ours = get_rope(head_dim, head_dim, 4096, theta, rope)(positions, q.clone(), k.clone())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_partial_rotary_leaves_the_tail_alone():
    rope = get_rope(8, 4, 16, 10000.0)
    q, k = torch.randn(3, 16), torch.randn(3, 8)
    q_out, k_out = rope(torch.tensor([1, 2, 3]), q.clone(), k.clone())  # in place on CPU
    assert torch.equal(q_out.view(3, 2, 8)[..., 4:], q.view(3, 2, 8)[..., 4:])
    assert not torch.allclose(q_out.view(3, 2, 8)[..., :4], q.view(3, 2, 8)[..., :4])


def test_unsupported_rope_type_is_rejected():
    with pytest.raises(ValueError, match="supported: default, linear, llama3"):
        get_rope(64, 64, 128, 10000.0, {"rope_type": "ntk-by-parts", "factor": 2.0})
    # YaRN is supported (DeepSeek); its original context length is required.
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        get_rope(64, 64, 128, 10000.0, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        get_rope(64, 64, 128, 10000.0, {"rope_type": "llama3", "factor": 2.0})


@pytest.mark.parametrize("native", [True, False])
def test_rmsnorm_fused_residual_equals_add_then_norm(monkeypatch, native):
    """Both paths: the native kernel (in place, like vLLM's fused_add_rms_norm) and torch."""
    if not native:
        monkeypatch.setattr(cpu_ops, "supports", lambda dtype: False)
    elif not cpu_ops.supports(torch.float32):
        pytest.skip("native CPU kernels unavailable")
    norm = RMSNorm(32, eps=1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    x, res = torch.randn(5, 32), torch.randn(5, 32)
    out, new_res = norm(x.clone(), res.clone())
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out, norm((x + res).clone()))
    expected = (x + res) / torch.sqrt(((x + res) ** 2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out, expected * norm.weight)


def _as_tp_rank(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(linear_mod, "get_tensor_model_parallel_world_size", lambda: size)
    monkeypatch.setattr(linear_mod, "get_tensor_model_parallel_rank", lambda: rank)


@pytest.mark.parametrize("num_kv_heads,tp", [(4, 2), (2, 4), (1, 2)])
def test_qkv_shards_give_each_rank_its_heads(monkeypatch, num_kv_heads, tp):
    """Rank r computes exactly its query heads and the kv heads they are grouped with."""
    heads, hd, hidden = 8, 4, 16
    wq = torch.randn(heads * hd, hidden)
    wk, wv = torch.randn(num_kv_heads * hd, hidden), torch.randn(num_kv_heads * hd, hidden)
    x = torch.randn(3, hidden)
    q_full = (x @ wq.T).view(3, heads, hd)
    k_full = (x @ wk.T).view(3, num_kv_heads, hd)
    group = heads // num_kv_heads
    for rank in range(tp):
        _as_tp_rank(monkeypatch, rank, tp)
        layer = linear_mod.QKVParallelLinear(hidden, hd, heads, num_kv_heads, bias=False)
        for shard, w in zip("qkv", (wq, wk, wv)):
            layer.weight.weight_loader(layer.weight, w, shard)
        q, k, _ = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        my_heads = range(rank * layer.num_heads, (rank + 1) * layer.num_heads)
        torch.testing.assert_close(q.view(3, -1, hd), q_full[:, list(my_heads)])
        my_kv = sorted({h // group for h in my_heads})
        assert len(my_kv) == layer.num_kv_heads
        torch.testing.assert_close(k.view(3, -1, hd), k_full[:, my_kv])


def test_merged_and_row_shards_reassemble_the_mlp(monkeypatch):
    hidden, inter, tp = 8, 12, 2
    wg, wu, wd = torch.randn(inter, hidden), torch.randn(inter, hidden), torch.randn(hidden, inter)
    x = torch.randn(4, hidden)
    expected = (torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)) @ wd.T
    partial_sum = torch.zeros_like(expected)
    for rank in range(tp):
        _as_tp_rank(monkeypatch, rank, tp)
        gate_up = linear_mod.MergedColumnParallelLinear(hidden, [inter, inter], bias=False)
        gate_up.weight.weight_loader(gate_up.weight, wg, 0)
        gate_up.weight.weight_loader(gate_up.weight, wu, 1)
        down = linear_mod.RowParallelLinear(inter, hidden, bias=False, reduce_results=False)
        down.weight.weight_loader(down.weight, wd)
        g, u = gate_up(x).chunk(2, dim=-1)
        partial_sum += down(torch.nn.functional.silu(g) * u)
    torch.testing.assert_close(partial_sum, expected)


def test_indivisible_heads_are_a_value_error(monkeypatch):
    _as_tp_rank(monkeypatch, 0, 3)
    with pytest.raises(ValueError, match="num_attention_heads"):
        linear_mod.QKVParallelLinear(16, 4, 8, 2)
    with pytest.raises(ValueError, match="shape mismatch"):
        _as_tp_rank(monkeypatch, 0, 1)
        layer = linear_mod.ReplicatedLinear(4, 4)
        layer.weight.weight_loader(layer.weight, torch.zeros(4, 5))


def test_dynamic_ntk_rope_uses_vllms_fixed_base():
    """'dynamic' (InternLM2's configs): vLLM's one enlarged base over max_position * factor
    positions; factor 1 is plain RoPE."""
    rope = get_rope(64, 64, 128, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
    base = 10000.0 * (2.0 * 256 / 128 - 1.0) ** (64 / 62)
    inv = 1.0 / base ** (torch.arange(0, 64, 2).float() / 64)
    assert rope.cos_sin_cache.shape == (256, 64)
    torch.testing.assert_close(rope.cos_sin_cache[5, :32], (5 * inv).cos())
    plain = get_rope(64, 64, 128, 10000.0)
    same = get_rope(64, 64, 128, 10000.0, {"rope_type": "dynamic", "factor": 1.0})
    torch.testing.assert_close(same.cos_sin_cache, plain.cos_sin_cache)


def _rotate(rope, positions, q, k):
    return rope.forward_native(positions, q.clone(), k.clone())


def test_rotary_tables_are_gathered_again_in_each_forward_pass():
    """A CUDA graph reads its positions from one static buffer, rewritten before each
    replay, and its capture runs in a pass of its own right after an eager warm-up
    on that same buffer. Tables kept from a call on the same tensor in an earlier
    pass would be baked into the graph with that call's positions (on an H200 every
    decode replayed rotated by the warm-up's position 0)."""
    from vllm.forward_context import set_forward_context
    rope = get_rope(16, 16, 64, 10000.0, dtype=torch.float32)
    q, k = torch.randn(4, 2 * 16), torch.randn(4, 16)
    static = torch.zeros(4, dtype=torch.long)
    with set_forward_context(None, [], None):
        warm = _rotate(rope, static, q, k)
    static.copy_(torch.tensor([5, 6, 7, 8]))
    with set_forward_context(None, [], None):
        replayed = _rotate(rope, static, q, k)
    fresh = _rotate(rope, torch.tensor([5, 6, 7, 8]), q, k)
    assert torch.equal(replayed[0], fresh[0]) and torch.equal(replayed[1], fresh[1])
    assert not torch.equal(replayed[0], warm[0])


def test_rotary_tables_are_gathered_once_per_pass(monkeypatch):
    """Within one pass every layer shares the tables of the first (the reason for
    the cache); outside a pass nothing is kept."""
    from vllm.forward_context import set_forward_context
    rope = get_rope(16, 16, 64, 10000.0, dtype=torch.float32)
    builds = []
    build = rope._build_tables
    monkeypatch.setattr(rope, "_build_tables", lambda *a: builds.append(1) or build(*a))
    q, k, positions = torch.randn(3, 16), torch.randn(3, 16), torch.tensor([1, 2, 3])
    with set_forward_context(None, [], None):
        for _ in range(4):  # four layers
            _rotate(rope, positions, q, k)
    assert len(builds) == 1  # one gather for the queries and keys of every layer
    _rotate(rope, positions, q, k)
    _rotate(rope, positions, q, k)
    assert len(builds) == 1 + 4  # outside a pass: one per rotation
