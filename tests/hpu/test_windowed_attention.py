"""Flat paged decode attention with a sliding window (whole blocks masked), a soft-cap and
ALiBi slopes, contiguous and gathered, against the explicit-score reference (itself
checked against a float64 naive ALiBi computation)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm.attention.ops.alibi import get_alibi_slopes
from vllm.hpu.paged_attn import build_flat_pa_metadata, flat_paged_attention
from vllm.attention.ops.masked_attention import masked_attention


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("window,cap,alibi", [(10, None, False), (None, 5.0, False),
                                              (20, 3.0, False), (None, None, True),
                                              (10, None, True)])
def test_flat_pa_window_and_soft_cap(contiguous, window, cap, alibi):
    torch.manual_seed(0)
    bs, hq, hkv, d = 16, 4, 2, 8
    tables, lens = [[3, 1, 6], [0], [5, 2]], [40, 5, 17]
    k_cache = torch.randn(8 * bs, hkv, d)
    v_cache = torch.randn(8 * bs, hkv, d)
    q = torch.randn(4, hq, d)
    md = build_flat_pa_metadata(tables, lens, bs, 4, 8 if contiguous else 10, pad_block_id=7,
                                contiguous=contiguous)
    slopes = get_alibi_slopes(hq) if alibi else None
    out = flat_paged_attention(q, k_cache, v_cache, md, 0.3, cap, window, slopes)
    layer = SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_size=d, scale=0.3,
                            logits_soft_cap=cap, sliding_window=window, alibi_slopes=slopes)
    for i, (table, n) in enumerate(zip(tables, lens)):
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        ref = masked_attention(layer, q[i].reshape(1, -1), k_cache[slots].flatten(1),
                               v_cache[slots].flatten(1), torch.tensor([n - 1]),
                               torch.arange(n))
        torch.testing.assert_close(out[i].reshape(1, -1), ref, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()


def test_masked_attention_alibi_matches_float64_naive():
    """ALiBi in the explicit-score reference: scores + slope * (k_pos - q_pos), causal,
    GQA, against a float64 computation written out head by head."""
    torch.manual_seed(1)
    hq, hkv, d, t = 6, 3, 8, 11
    q, k, v = torch.randn(t, hq * d), torch.randn(t, hkv * d), torch.randn(t, hkv * d)
    slopes = get_alibi_slopes(hq)
    layer = SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_size=d, scale=0.4,
                            logits_soft_cap=None, sliding_window=None, alibi_slopes=slopes)
    out = masked_attention(layer, q, k, v, torch.arange(t), torch.arange(t))
    ref = torch.empty(t, hq, d, dtype=torch.float64)
    qd, kd, vd = (x.double().view(t, -1, d) for x in (q, k, v))
    for h in range(hq):
        kv = h // (hq // hkv)
        for i in range(t):
            s = (kd[:i + 1, kv] @ qd[i, h]) * 0.4 + slopes[h].double() * (
                torch.arange(i + 1, dtype=torch.float64) - i)
            ref[i, h] = torch.softmax(s, 0) @ vd[:i + 1, kv]
    torch.testing.assert_close(out.double(), ref.view(t, -1), atol=1e-5, rtol=1e-5)
