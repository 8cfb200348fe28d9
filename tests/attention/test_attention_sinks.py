"""Attention sinks (GPT-OSS: one learned logit per head in every softmax denominator)
on every torch path, against a float64 computation written out query by query: the
explicit-score reference, the layer without a cache, the CPU backend's mixed step
(decodes, a fresh prompt, a chunk after a context; torch and native metadata), and
the HPU's prompt and flat decode attention. (The Triton kernel's sinks are tested in
tests/kernels/test_triton_attention.py.)"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest
import torch

from vllm.attention.backends.torch_sdpa import PrefillSeq, build_metadata
from vllm.attention.ops.masked_attention import masked_attention

HQ, HKV, D, BS = 4, 2, 8, 4
SINKS = torch.tensor([1.5, -0.5, 3.0, 0.2])


def _layer(window: Optional[int] = None, sinks: Optional[torch.Tensor] = SINKS):
    return SimpleNamespace(num_heads=HQ, num_kv_heads=HKV, head_size=D, scale=0.35,
                           logits_soft_cap=None, sliding_window=window, alibi_slopes=None,
                           sinks=sinks)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: range,
          window: Optional[int], sinks: torch.Tensor, scale: float = 0.35) -> torch.Tensor:
    """float64: q [n, HQ, D] at `positions` of a sequence whose keys are k/v [T, HKV, D]."""
    out = torch.empty(len(positions), HQ, D, dtype=torch.float64)
    kd, vd = k.double(), v.double()
    for i, p in enumerate(positions):
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(HQ):
            kv = h // (HQ // HKV)
            s = (kd[lo:p + 1, kv] @ q[i, h].double()) * scale
            w = torch.softmax(torch.cat((s, sinks[h:h + 1].double())), 0)[:-1]
            out[i, h] = w @ vd[lo:p + 1, kv]
    return out.reshape(len(positions), HQ * D)


@pytest.mark.parametrize("window", [None, 3])
def test_masked_attention_and_the_layer_without_cache(window):
    from vllm.attention import Attention
    torch.manual_seed(0)
    t = 9
    q, k, v = torch.randn(t, HQ, D), torch.randn(t, HKV, D), torch.randn(t, HKV, D)
    ref = naive(q, k, v, range(t), window, SINKS)
    pos = torch.arange(t)
    out = masked_attention(_layer(window), q.flatten(1), k.flatten(1), v.flatten(1), pos, pos)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    attn = Attention(HQ, D, 0.35, HKV, prefix="model.layers.0.attn",
                     per_layer_sliding_window=window, sinks=SINKS.clone())
    out = attn(q.flatten(1), k.flatten(1), v.flatten(1))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    # Sinks change the result (they are not a no-op on these scores).
    plain = masked_attention(_layer(window, None), q.flatten(1), k.flatten(1), v.flatten(1),
                             pos, pos)
    assert (plain - out).abs().max() > 1e-2


def test_attention_refuses_sinks_of_the_wrong_shape():
    from vllm.attention import Attention
    with pytest.raises(ValueError, match="sinks"):
        Attention(HQ, D, 0.35, HKV, prefix="model.layers.0.attn", sinks=torch.zeros(HQ + 1))


@pytest.mark.parametrize("native", [False, True], ids=["torch", "native-metadata"])
@pytest.mark.parametrize("window", [None, 5])
def test_cpu_backend_mixed_step_with_sinks(native, window):
    """Decodes (one past the window), a fresh prompt and a chunk after a context, in one
    step: every row equals the float64 reference over its sequence's history."""
    from vllm.cpu.attention import CpuAttentionImpl
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    num_blocks = 32
    cache = torch.zeros(2, HKV, num_blocks * BS, D)
    seqs = [(9, 1), (1, 1), (14, 1), (6, 6), (11, 4)]  # (total length, new this step)
    blocks = rng.permutation(num_blocks)[:sum(-(-t // BS) for t, _ in seqs)].tolist()
    tables, full = [], []
    for total, _ in seqs:
        n = -(-total // BS)
        tables.append(blocks[:n])
        blocks = blocks[n:]
        full.append((torch.randn(total, HQ, D), torch.randn(total, HKV, D),
                     torch.randn(total, HKV, D)))
    for (total, new), table, (_, k, v) in zip(seqs, tables, full):
        for p in range(total - new):
            slot = table[p // BS] * BS + p % BS
            cache[0, :, slot], cache[1, :, slot] = k[p], v[p]
    rows, slot_map, prefills, prefill_blocks, offset = [], [], [], [], 0
    for i, ((total, new), table, (q, k, v)) in enumerate(zip(seqs, tables, full)):
        rows.append((q[total - new:], k[total - new:], v[total - new:]))
        slot_map += [table[p // BS] * BS + p % BS for p in range(total - new, total)]
        if i >= 3:
            prefills.append(PrefillSeq(query_start=offset, query_len=new,
                                       context_len=total - new))
            prefill_blocks.append(table)
        offset += new
    decode_table = np.zeros((3, 4), dtype=np.int64)
    for i in range(3):
        decode_table[i, :len(tables[i])] = tables[i]
    md = build_metadata(torch.tensor(slot_map), decode_table,
                        np.array([s[0] for s in seqs[:3]]), prefills, prefill_blocks, BS,
                        "cpu", native=native)
    q, k, v = (torch.cat([r[j] for r in rows]) for j in range(3))
    out = CpuAttentionImpl().forward(_layer(window), q.flatten(1), k.flatten(1),
                                     v.flatten(1), cache, md)
    offset = 0
    for (total, new), (fq, fk, fv) in zip(seqs, full):
        ref = naive(fq[total - new:], fk, fv, range(total - new, total), window, SINKS)
        torch.testing.assert_close(out[offset:offset + new].double(), ref, atol=1e-5,
                                   rtol=1e-5)
        offset += new


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("window", [None, 10])
def test_hpu_flat_decode_with_sinks(contiguous, window):
    from vllm.hpu.paged_attn import build_flat_pa_metadata, flat_paged_attention
    torch.manual_seed(2)
    bs = 16
    tables, lens = [[3, 1, 6], [0], [5, 2]], [40, 5, 17]
    k_cache, v_cache = torch.randn(8 * bs, HKV, D), torch.randn(8 * bs, HKV, D)
    q = torch.randn(4, HQ, D)  # one padding row
    md = build_flat_pa_metadata(tables, lens, bs, 4, 8 if contiguous else 10, pad_block_id=7,
                                contiguous=contiguous)
    out = flat_paged_attention(q, k_cache, v_cache, md, 0.35, None, window, None, None,
                               SINKS)
    for i, (table, n) in enumerate(zip(tables, lens)):
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        ref = naive(q[i:i + 1], k_cache[slots], v_cache[slots], range(n - 1, n), window,
                    SINKS)
        torch.testing.assert_close(out[i].reshape(1, -1).double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("window", [None, 4])
def test_hpu_prompt_with_sinks(window):
    """Two right-padded prompts, the second after a 3-token context."""
    from vllm.hpu.paged_attn import prompt_attention_masked
    torch.manual_seed(3)
    t = 6
    q, k, v = torch.randn(2, t, HQ, D), torch.randn(2, t, HKV, D), torch.randn(2, t, HKV, D)
    new = torch.arange(t)[None, :].expand(2, t)
    out = prompt_attention_masked(q, k, v, new, new, torch.ones_like(new, dtype=torch.bool),
                                  0.35, None, window, None, SINKS)
    for b, n in enumerate((6, 4)):
        ref = naive(q[b, :n], k[b, :n], v[b, :n], range(n), window, SINKS)
        torch.testing.assert_close(out[b, :n].reshape(n, -1).double(), ref, atol=1e-5,
                                   rtol=1e-5)
    # With a context of 3 cached tokens in front of the new ones.
    ctx_k, ctx_v = torch.randn(1, 4, HKV, D), torch.randn(1, 4, HKV, D)  # 1 slot unused
    q_pos = 3 + torch.arange(t)[None, :]
    k_pos = torch.cat((torch.arange(4)[None, :], q_pos), 1)
    k_valid = torch.cat((torch.arange(4)[None, :] < 3, torch.ones(1, t, dtype=torch.bool)), 1)
    out = prompt_attention_masked(q[:1], torch.cat((ctx_k, k[:1]), 1),
                                  torch.cat((ctx_v, v[:1]), 1), q_pos, k_pos, k_valid, 0.35,
                                  None, window, None, SINKS)
    hist_k = torch.cat((ctx_k[0, :3], k[0]))
    hist_v = torch.cat((ctx_v[0, :3], v[0]))
    ref = naive(q[0], hist_k, hist_v, range(3, 3 + t), window, SINKS)
    torch.testing.assert_close(out[0].reshape(t, -1).double(), ref, atol=1e-5, rtol=1e-5)
