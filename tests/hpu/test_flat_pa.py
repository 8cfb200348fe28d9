"""Flat paged attention and HPU prefill attention against naive float64 references."""
from __future__ import annotations

import math
import random

import pytest
import torch

from vllm.hpu.paged_attn import (build_flat_pa_metadata, flat_paged_attention,
                                               prompt_attention, prompt_attention_with_context,
                                               write_to_kv_cache)
from vllm.hpu.graph_keys import input_signature

HQ, HKV, D = 8, 2, 16


def _naive_decode(q, k_cache, v_cache, tables, lens, block_size, scale):
    """One sequence at a time, float64, K/V repeated per query head."""
    outs = []
    for i, (table, n) in enumerate(zip(tables, lens)):
        slots = [table[p // block_size] * block_size + p % block_size for p in range(n)]
        k = k_cache[slots].double().repeat_interleave(HQ // HKV, dim=1)  # [n, HQ, D]
        v = v_cache[slots].double().repeat_interleave(HQ // HKV, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].double() * scale, k)
        outs.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(outs)


def _random_batch(rng, num_seqs, block_size, total_blocks, max_len, low_ids=False):
    lens = [rng.randint(1, max_len) for _ in range(num_seqs)]
    need = [-(-n // block_size) for n in lens]
    pool = list(range(total_blocks))
    if not low_ids:
        rng.shuffle(pool)
    tables, at = [], 0
    for k in need:
        tables.append(pool[at:at + k] + [pool[-1]])  # one spare block past the length
        at += k
    return tables, lens


def _caches(num_blocks, block_size, dtype=torch.float32):
    # Random everywhere (pad block included): masking, not zeros, must hide garbage.
    k = torch.randn((num_blocks + 1) * block_size, HKV, D, dtype=dtype)
    v = torch.randn((num_blocks + 1) * block_size, HKV, D, dtype=dtype)
    return k, v


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_pa_matches_naive(block_size, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    num_blocks = 48
    k_cache, v_cache = _caches(num_blocks, block_size)
    tables, lens = _random_batch(rng, 5, block_size, num_blocks - 1, 3 * block_size + 5)
    scale = 1 / math.sqrt(D)
    batch_pad, blocks_pad = 8, sum(-(-n // block_size) for n in lens) + 7
    md = build_flat_pa_metadata(tables, lens, block_size, batch_pad, blocks_pad,
                                pad_block_id=num_blocks)
    q = torch.randn(batch_pad, HQ, D)
    out = flat_paged_attention(q, k_cache, v_cache, md, scale)
    ref = _naive_decode(q, k_cache, v_cache, tables, lens, block_size, scale)
    assert out.shape == (batch_pad, HQ, D)
    assert (out[:5].double() - ref).abs().max().item() < 1e-5
    assert torch.isfinite(out).all()
    assert out[5:].abs().max().item() == 0.0  # padding rows own no blocks


@pytest.mark.parametrize("seed", [3, 4])
def test_contiguous_flat_pa_matches_naive(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    block_size, num_blocks = 16, 64
    k_cache, v_cache = _caches(num_blocks, block_size)
    tables, lens = _random_batch(rng, 6, block_size, 40, 90)
    # Holes: drop a few sequences so some low blocks are unused.
    tables, lens = tables[::2], lens[::2]
    top = max(max(t[:-1]) for t in tables)  # the last entry is the unused spare
    blocks_pad = 48
    assert top < blocks_pad
    md = build_flat_pa_metadata(tables, lens, block_size, 4, blocks_pad,
                                pad_block_id=num_blocks, contiguous=True)
    assert md.block_list is None and md.block_groups.shape == (blocks_pad,)
    q = torch.randn(4, HQ, D)
    out = flat_paged_attention(q, k_cache, v_cache, md, 0.3)
    ref = _naive_decode(q, k_cache, v_cache, tables, lens, block_size, 0.3)
    assert (out[:len(lens)].double() - ref).abs().max().item() < 1e-5
    assert torch.isfinite(out).all()


def test_flat_pa_bf16_close():
    rng = random.Random(7)
    torch.manual_seed(7)
    k_cache, v_cache = _caches(32, 16, torch.bfloat16)
    tables, lens = _random_batch(rng, 4, 16, 31, 60)
    md = build_flat_pa_metadata(tables, lens, 16, 4, 20, pad_block_id=32,
                                dtype=torch.bfloat16)
    q = torch.randn(4, HQ, D, dtype=torch.bfloat16)
    out = flat_paged_attention(q, k_cache, v_cache, md, 0.25)
    ref = _naive_decode(q, k_cache, v_cache, tables, lens, 16, 0.25)
    assert (out.double() - ref).abs().max().item() < 5e-2


def test_metadata_fields_by_hand():
    md = build_flat_pa_metadata([[5, 2], [7]], [20, 3], block_size=16, batch_size=3,
                                num_blocks=5, pad_block_id=9)
    assert md.block_list.tolist() == [5, 2, 7, 9, 9]
    assert md.block_groups.tolist() == [0, 0, 1, -1, -1]
    assert md.block_usage.tolist() == [16, 4, 3, 1, 1]
    assert torch.isinf(md.block_bias[1, 4:]).all() and (md.block_bias[1, :4] == 0).all()
    assert md.block_mapping.tolist() == [[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0],
                                         [0, 0, 0]]
    contig = build_flat_pa_metadata([[5, 2], [7]], [20, 3], 16, 3, 8, 9, contiguous=True)
    assert contig.block_groups.tolist() == [-1, -1, 0, -1, -1, 0, -1, 1]
    assert contig.block_usage.tolist() == [1, 1, 4, 1, 1, 16, 1, 3]


def test_metadata_shapes_depend_only_on_bucket():
    a = build_flat_pa_metadata([[1, 2, 3]], [40], 16, 4, 16, 99)
    b = build_flat_pa_metadata([[4], [5, 6], [7]], [3, 17, 1], 16, 4, 16, 99)
    assert input_signature(a) == input_signature(b)


def test_metadata_rejects_bad_input():
    with pytest.raises(ValueError, match="num_blocks"):
        build_flat_pa_metadata([[1, 2, 3]], [40], 16, 1, 2, 99)
    with pytest.raises(ValueError, match="block id 30"):
        build_flat_pa_metadata([[30]], [4], 16, 1, 8, 99, contiguous=True)
    with pytest.raises(ValueError, match="batch_size"):
        build_flat_pa_metadata([[1], [2]], [4, 4], 16, 1, 8, 99)
    with pytest.raises(ValueError, match="needs 2"):
        build_flat_pa_metadata([[1]], [17], 16, 1, 8, 99)


def test_write_to_kv_cache_slots():
    k_cache = torch.zeros(4 * 8, HKV, D)
    v_cache = torch.zeros(4 * 8, HKV, D)
    key, value = torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    slots = torch.tensor([2 * 8 + 0, 2 * 8 + 1, 0 * 8 + 7])
    write_to_kv_cache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache[17], key[1]) and torch.equal(v_cache[7], value[2])
    assert k_cache.abs().sum() == key.abs().sum()


def _naive_prefill(q, k, v, past_k, past_v, q_len, scale):
    """q [t, HQ, D], k/v new [t, HKV, D], past [c, HKV, D] -> [t, HQ, D] in float64."""
    g = HQ // HKV
    kk = torch.cat([past_k, k]).double().repeat_interleave(g, 1)
    vv = torch.cat([past_v, v]).double().repeat_interleave(g, 1)
    c = past_k.shape[0]
    s = torch.einsum("thd,shd->hts", q.double() * scale, kk)
    allowed = torch.arange(c + q_len)[None, :] <= (c + torch.arange(q_len))[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), vv)


def test_prompt_attention_matches_naive():
    torch.manual_seed(0)
    lens = [5, 12, 1]
    t = 16
    q, k, v = torch.randn(3, t, HQ, D), torch.randn(3, t, HKV, D), torch.randn(3, t, HKV, D)
    out = prompt_attention(q, k, v, torch.tensor(lens), 0.25)
    empty = torch.zeros(0, HKV, D)
    for i, n in enumerate(lens):
        ref = _naive_prefill(q[i, :n], k[i, :n], v[i, :n], empty, empty, n, 0.25)
        assert (out[i, :n].double() - ref).abs().max().item() < 1e-5
        assert out[i, n:].abs().max().item() == 0.0  # padded query rows


def test_prompt_attention_with_context_matches_naive():
    torch.manual_seed(1)
    rng = random.Random(1)
    block_size, num_blocks, ctx_blocks, t = 8, 40, 4, 12
    k_cache, v_cache = _caches(num_blocks, block_size)
    ctx_lens, q_lens = [13, 0, 32, 8], [12, 7, 1, 3]
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    table = [[ids.pop() for _ in range(-(-c // block_size))] for c in ctx_lens]
    padded = torch.tensor([row + [num_blocks] * (ctx_blocks - len(row)) for row in table])
    q, k, v = torch.randn(4, t, HQ, D), torch.randn(4, t, HKV, D), torch.randn(4, t, HKV, D)
    out = prompt_attention_with_context(q, k, v, k_cache, v_cache, padded,
                                        torch.tensor(ctx_lens), block_size, 0.3)
    assert torch.isfinite(out).all()
    for i, (c, n) in enumerate(zip(ctx_lens, q_lens)):
        slots = [table[i][p // block_size] * block_size + p % block_size for p in range(c)]
        ref = _naive_prefill(q[i, :n], k[i, :n], v[i, :n], k_cache[slots], v_cache[slots], n,
                             0.3)
        assert (out[i, :n].double() - ref).abs().max().item() < 1e-5
