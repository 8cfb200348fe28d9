"""Graph-safe KV cache on the HPU path: separate K/V tensors, flat PA without
scatter ops (exact against float64 at extreme score ranges), FusedSDPA GQA modes."""
from __future__ import annotations

import math
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from vllm.hpu import habana
from vllm.hpu.attention import HPUAttentionImpl, HPUKVCache
from vllm.hpu.paged_attn import (build_flat_pa_metadata, flat_paged_attention,
                                               grouped_max, prompt_attention,
                                               prompt_attention_with_context)

HQ, HKV, D = 8, 2, 16


class _OpLog(TorchDispatchMode):
    """Names of the aten ops run inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _naive_decode(q, k_cache, v_cache, tables, lens, block_size, scale):
    outs = []
    for i, (table, n) in enumerate(zip(tables, lens)):
        slots = [table[p // block_size] * block_size + p % block_size for p in range(n)]
        k = k_cache[slots].double().repeat_interleave(HQ // HKV, dim=1)
        v = v_cache[slots].double().repeat_interleave(HQ // HKV, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].double() * scale, k)
        outs.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(outs)


@pytest.mark.parametrize("contiguous", [False, True])
def test_flat_pa_extreme_score_ranges_match_float64(contiguous):
    """Sequences whose scores live at wildly different magnitudes in one batch: a
    shared (global) maximum would underflow the small ones to 0/0; the per-sequence
    maximum keeps every row exact."""
    rng = random.Random(3)
    torch.manual_seed(3)
    bs, num_blocks = 8, 40
    k_cache = torch.randn((num_blocks + 1) * bs, HKV, D)
    v_cache = torch.randn((num_blocks + 1) * bs, HKV, D)
    lens = [1, 9, 30, 17, 8]
    ids = list(range(num_blocks))
    if not contiguous:
        rng.shuffle(ids)
    tables, at = [], 0
    for n in lens:
        k = -(-n // bs)
        tables.append(ids[at:at + k])
        at += k
    # One block of sequence 2 gets keys ~1e3 times larger: its scores dominate.
    big = tables[2][1]
    k_cache[big * bs:(big + 1) * bs] *= 1e3
    q = torch.randn(6, HQ, D)
    q[0] *= 1e3      # scores ~ +-1e4 in sequence 0
    q[1] *= 1e-4     # scores ~ 1e-4 in sequence 1 (nearly uniform)
    q[3] *= 300.0    # large negative and positive scores in sequence 3
    n_pad = num_blocks if contiguous else sum(-(-n // bs) for n in lens) + 3
    md = build_flat_pa_metadata(tables, lens, bs, 6, n_pad, pad_block_id=num_blocks,
                                contiguous=contiguous)
    scale = 1 / math.sqrt(D)
    out = flat_paged_attention(q, k_cache, v_cache, md, scale)
    ref = _naive_decode(q, k_cache, v_cache, tables, lens, bs, scale)
    assert torch.isfinite(out).all()
    err = (out[:5].double() - ref).abs() / ref.abs().amax(dim=(1, 2), keepdim=True)
    assert err.max().item() < 1e-5
    assert out[5].abs().max().item() == 0.0


def test_flat_pa_uses_no_scatter_op():
    """The per-sequence max is an index_reduce_ on rows, not a scatter_reduce."""
    bs = 4
    k_cache, v_cache = torch.randn(9 * bs, HKV, D), torch.randn(9 * bs, HKV, D)
    md = build_flat_pa_metadata([[0, 3], [5]], [6, 2], bs, 4, 6, pad_block_id=8)
    with _OpLog() as log:
        flat_paged_attention(torch.randn(4, HQ, D), k_cache, v_cache, md, 0.25)
    assert not [op for op in log.ops if "scatter" in op], log.ops
    assert "aten.index_reduce" in log.ops or "aten.index_reduce_" in log.ops


def test_grouped_max_by_hand():
    block_max = torch.tensor([[1.0], [5.0], [-2.0], [7.0], [0.5]])
    groups = torch.tensor([0, 0, 2, -1, 2])
    got = grouped_max(block_max, groups, batch=3)
    assert got.view(-1).tolist() == [5.0, float("-inf"), 0.5, 7.0]


def _naive_causal(q, k, v, n, scale):
    g = q.shape[1] // k.shape[1]
    kk = k[:n].double().repeat_interleave(g, 1)
    vv = v[:n].double().repeat_interleave(g, 1)
    s = torch.einsum("thd,shd->hts", q[:n].double() * scale, kk)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), vv)


class _SpySDPA:
    """Records the head counts FusedSDPA receives (older software needs Hq == Hkv)."""

    def __init__(self, real) -> None:
        self.real, self.heads = real, []

    def apply(self, q, k, v, *args):
        self.heads.append((q.shape[1], k.shape[1], v.shape[1]))
        return self.real.apply(q, k, v, *args)


@pytest.mark.parametrize("mode", ["native", "repeat"])
def test_fsdpa_gqa_modes_match_float64(mode, monkeypatch):
    spy = _SpySDPA(habana.FusedSDPA)
    monkeypatch.setattr(habana, "FusedSDPA", spy)
    torch.manual_seed(0)
    lens, t = [5, 12], 12
    q, k, v = torch.randn(2, t, HQ, D), torch.randn(2, t, HKV, D), torch.randn(2, t, HKV, D)
    out = prompt_attention(q, k, v, torch.tensor(lens), 0.25, gqa_mode=mode)
    for i, n in enumerate(lens):
        ref = _naive_causal(q[i], k[i], v[i], n, 0.25)
        assert (out[i, :n].double() - ref).abs().max().item() < 1e-5
    # With a context: the masked FusedSDPA call gets the same K/V treatment.
    bs = 4
    k_cache, v_cache = torch.randn(9 * bs, HKV, D), torch.randn(9 * bs, HKV, D)
    blocks = torch.tensor([[2, 8], [8, 8]])  # sequence 0 has 3 context tokens in block 2
    ctx = prompt_attention_with_context(q, k, v, k_cache, v_cache, blocks,
                                        torch.tensor([3, 0]), bs, 0.25, gqa_mode=mode)
    past_k, past_v = k_cache[8:11], v_cache[8:11]
    ref = _naive_causal_ctx(q[0, :5], k[0, :5], v[0, :5], past_k, past_v, 0.25)
    assert (ctx[0, :5].double() - ref).abs().max().item() < 1e-5
    kv_heads = HQ if mode == "repeat" else HKV
    assert spy.heads == [(HQ, kv_heads, kv_heads)] * 2


def _naive_causal_ctx(q, k, v, past_k, past_v, scale):
    g = q.shape[1] // k.shape[1]
    c, n = past_k.shape[0], q.shape[0]
    kk = torch.cat([past_k, k]).double().repeat_interleave(g, 1)
    vv = torch.cat([past_v, v]).double().repeat_interleave(g, 1)
    s = torch.einsum("thd,shd->hts", q.double() * scale, kk)
    allowed = torch.arange(c + n)[None, :] <= (c + torch.arange(n))[:, None]
    return torch.einsum("hts,shd->thd", s.masked_fill(~allowed, float("-inf")).softmax(-1), vv)


def test_fsdpa_gqa_mode_validated(monkeypatch):
    monkeypatch.setenv("VLLM_HPU_FSDPA_GQA", "expand")
    with pytest.raises(ValueError, match="VLLM_HPU_FSDPA_GQA"):
        HPUAttentionImpl()
    monkeypatch.setenv("VLLM_HPU_FSDPA_GQA", "repeat")
    assert HPUAttentionImpl().fsdpa_gqa == "repeat"


def test_runner_kv_cache_is_separate_k_and_v(tiny_model_factory):
    """Every layer holds two whole tensors that share no memory; the repeat GQA mode
    serves the tiny (GQA) model with the CPU platform's greedy tokens."""
    from vllm import SamplingParams
    from vllm.attention.selector import load_attn_backend
    prompts = ["The capital of France is", "def fibonacci(n):"]
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    args = dict(model=tiny_model_factory("llama"), max_model_len=128, max_num_seqs=4,
                num_gpu_blocks_override=16, block_size=16)
    with platform_env("cpu"):
        llm = make_llm(**args)
        expected = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        release(llm)
    load_attn_backend.cache_clear()  # the backend reads the knob when built
    try:
        with platform_env("hpu", VLLM_SKIP_WARMUP="true", VLLM_HPU_FSDPA_GQA="repeat",
                          **SMALL_BUCKETS):
            llm = make_llm(**args)
            runner = runner_of(llm)
            assert runner.attn_impl.fsdpa_gqa == "repeat"
            caches = [c for c in runner.kv_caches if c is not None]
            assert len(caches) == 2 and all(isinstance(c, HPUKVCache) for c in caches)
            spans = []
            for t in (t for cache in caches for t in cache):
                assert t.dim() == 3 and t.shape[0] == 17 * 16
                spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
            spans.sort()
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
            assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == expected
            release(llm)
    finally:
        load_attn_backend.cache_clear()
