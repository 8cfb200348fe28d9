"""The CPU attention backend (vllm/cpu/attention.py over torch_sdpa) against dense
per-sequence attention.

One step mixes decodes, a fresh prompt and a chunk of a prompt with context, with
blocks scattered over the cache, GQA, and the head-major cache layout; every output
row must equal plain causal attention over that sequence's full history.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm.attention.backends import torch_sdpa
from vllm.attention.backends.torch_sdpa import (PrefillSeq,
                                                build_metadata, context_slots,
                                                group_decodes)
from vllm.cpu import cpu_ops, prefill_ops
from vllm.cpu.attention import CpuAttentionImpl

HQ, HKV, D, BS = 6, 2, 16, 4


class _Layer:
    num_heads, num_kv_heads, head_size, scale = HQ, HKV, D, D ** -0.5


def _dense(q, k, v):
    """Causal attention of a whole sequence; q [T, HQ, D], k/v [T, HKV, D]."""
    t = q.shape[0]
    kk = k.repeat_interleave(HQ // HKV, dim=1)
    vv = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * _Layer.scale
    scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(t, HQ * D)


def test_context_slots_follow_the_block_table():
    table = np.array([[5, 2, 0], [7, 0, 0]])
    slots, valid = context_slots(table, np.array([6, 3]), BS)
    assert slots.tolist() == [[20, 21, 22, 23, 8, 9], [28, 29, 30, 0, 0, 0]]
    assert valid.sum(1).tolist() == [6, 3]
    slots, valid = context_slots(table, np.array([6, 3]), BS, align=8)
    assert slots.shape == (2, 8) and slots[0, :6].tolist() == [20, 21, 22, 23, 8, 9]
    assert not slots[:, 6:].any() and valid.sum(1).tolist() == [6, 3]


@pytest.mark.parametrize("native,flash", [(False, False), (True, False), (True, True)],
                         ids=["torch", "native", "native-flash"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_mixed_step_matches_dense_attention(dtype, tol, native, flash):
    """Decodes through the padded groups (torch) or the native kernel (vllm/cpu);
    prefills through SDPA or (flash) the native prefill kernel, in the same step."""
    if native and not cpu_ops.usable(torch.empty(0)):
        pytest.skip("native CPU kernels unavailable")
    if flash and prefill_ops.get_prefill_lib() is None:
        pytest.skip("native prefill kernel unavailable")
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    num_blocks = 64
    cache = torch.zeros(2, HKV, num_blocks * BS, D, dtype=dtype)
    # (total length, tokens computed this step): 3 decodes, a fresh prompt, a chunk.
    seqs = [(9, 1), (1, 1), (17, 1), (7, 7), (13, 5)]
    blocks = rng.permutation(num_blocks)[:sum(-(-t // BS) for t, _ in seqs)].tolist()
    tables, full = [], []
    for total, _ in seqs:
        n = -(-total // BS)
        tables.append(blocks[:n])
        blocks = blocks[n:]
        full.append(tuple(torch.randn(total, h, D, dtype=dtype) for h in (HQ, HKV, HKV)))
    # Write the history (everything before this step) straight into the cache.
    for (total, new), table, (_, k, v) in zip(seqs, tables, full):
        for p in range(total - new):
            slot = table[p // BS] * BS + p % BS
            cache[0, :, slot], cache[1, :, slot] = k[p], v[p]
    q_rows, k_rows, v_rows, slot_map, prefills, prefill_blocks = [], [], [], [], [], []
    offset = 0
    for i, ((total, new), table, (q, k, v)) in enumerate(zip(seqs, tables, full)):
        q_rows.append(q[total - new:])
        k_rows.append(k[total - new:])
        v_rows.append(v[total - new:])
        slot_map += [table[p // BS] * BS + p % BS for p in range(total - new, total)]
        if i >= 3:
            prefills.append(PrefillSeq(query_start=offset, query_len=new,
                                       context_len=total - new, flash=flash))
            prefill_blocks.append(table)
        offset += new
    decode_table = np.zeros((3, 5), dtype=np.int64)
    for i in range(3):
        decode_table[i, :len(tables[i])] = tables[i]
    md = build_metadata(torch.tensor(slot_map), decode_table,
                        np.array([s[0] for s in seqs[:3]]), prefills, prefill_blocks, BS, "cpu",
                        native=native)
    assert (md.decode_block_table is not None) == native
    assert (md.flash is not None) == flash
    q, k, v = (torch.cat(x) for x in (q_rows, k_rows, v_rows))
    out = CpuAttentionImpl().forward(_Layer(), q.reshape(len(q), -1), k.reshape(len(k), -1),
                                         v.reshape(len(v), -1), cache, md)
    offset = 0
    for (total, new), (fq, fk, fv) in zip(seqs, full):
        ref = _dense(fq.float(), fk.float(), fv.float())[total - new:]
        torch.testing.assert_close(out[offset:offset + new].float(), ref, atol=tol, rtol=tol)
        offset += new


@pytest.mark.parametrize("lens,align", [([6, 2, 8], 32), ([7, 7, 7], 32), ([7, 7, 7], 1)],
                         ids=["padded", "aligned", "no-padding"])
def test_decode_only_step_returns_every_row(lens, align, monkeypatch):
    monkeypatch.setattr(torch_sdpa, "DECODE_LEN_ALIGN", align)
    torch.manual_seed(1)
    cache = torch.randn(2, HKV, 8 * BS, D)
    table = np.array([[3, 1], [0, 5], [6, 2]], dtype=np.int64)
    lens = np.array(lens)
    slot_map = torch.tensor([table[i, (n - 1) // BS] * BS + (n - 1) % BS
                             for i, n in enumerate(lens)])
    md = build_metadata(slot_map, table, lens, [], [], BS, "cpu")
    assert len(md.decode_groups) == 1
    assert md.decode_groups[0].max_len == -(-max(lens) // align) * align
    assert (md.decode_groups[0].bias is None) == (align == 1)
    q, k, v = torch.randn(3, HQ * D), torch.randn(3, HKV * D), torch.randn(3, HKV * D)
    out = CpuAttentionImpl().forward(_Layer(), q, k, v, cache, md)
    assert out.shape == (3, HQ * D)
    for i, n in enumerate(lens):
        slots = [table[i, p // BS] * BS + p % BS for p in range(n)]
        kk, vv = cache[0][:, slots].transpose(0, 1), cache[1][:, slots].transpose(0, 1)
        qq = q[i].view(1, HQ, D)
        # The last position is the new token itself: dense attention at row n - 1.
        full_q = torch.zeros(n, HQ, D)
        full_q[-1] = qq[0]
        ref = _dense(full_q, kk, vv)[-1]
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)


def test_decodes_of_very_different_lengths_get_their_own_groups():
    lens = np.array([3, 5, 40, 300, 310, 320, 900])
    assert group_decodes(lens, align=32, min_saving=0) == [(0, 2), (2, 3), (3, 6), (6, 7)]
    # Splitting must pay for itself: a few short rows stay with the long ones.
    assert group_decodes(np.array([5, 300, 310]), align=32, min_saving=512) == [(0, 3)]
    assert group_decodes(np.array([7, 7, 7]), align=32) == [(0, 3)]
    assert group_decodes(np.array([1]), align=1) == [(0, 1)]


def test_grouped_decodes_match_dense_attention(monkeypatch):
    """Many groups in one step (tiny split threshold), each row checked densely."""
    monkeypatch.setattr(torch_sdpa, "DECODE_GROUP_MIN_SAVING", 0)
    monkeypatch.setattr(torch_sdpa, "DECODE_LEN_ALIGN", 4)
    torch.manual_seed(2)
    lens = np.array([2, 3, 9, 10, 30])
    num_blocks = 32
    cache = torch.randn(2, HKV, num_blocks * BS, D)
    rng = np.random.default_rng(2)
    perm = rng.permutation(num_blocks).tolist()
    table = np.zeros((len(lens), 8), dtype=np.int64)
    for i, n in enumerate(lens):
        nb = -(-n // BS)
        table[i, :nb] = perm[:nb]
        perm = perm[nb:]
    slot_map = torch.tensor([table[i, (n - 1) // BS] * BS + (n - 1) % BS
                             for i, n in enumerate(lens)])
    md = build_metadata(slot_map, table, lens, [], [], BS, "cpu")
    assert len(md.decode_groups) >= 3
    q, k, v = (torch.randn(len(lens), h * D) for h in (HQ, HKV, HKV))
    out = CpuAttentionImpl().forward(_Layer(), q, k, v, cache, md)
    for i, n in enumerate(lens):
        slots = [table[i, p // BS] * BS + p % BS for p in range(n)]
        kk, vv = cache[0][:, slots].transpose(0, 1), cache[1][:, slots].transpose(0, 1)
        full_q = torch.zeros(n, HQ, D)
        full_q[-1] = q[i].view(HQ, D)
        torch.testing.assert_close(out[i], _dense(full_q, kk, vv)[-1], atol=1e-5, rtol=1e-5)
