"""Flat paged decode attention with a sliding window (whole blocks masked) and a soft-cap,
contiguous and gathered, against the explicit-score reference."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm.attention.ops.hpu_paged_attn import build_flat_pa_metadata, flat_paged_attention
from vllm.attention.ops.masked_attention import masked_attention


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("window,cap", [(10, None), (None, 5.0), (20, 3.0)])
def test_flat_pa_window_and_soft_cap(contiguous, window, cap):
    torch.manual_seed(0)
    bs, hq, hkv, d = 16, 4, 2, 8
    tables, lens = [[3, 1, 6], [0], [5, 2]], [40, 5, 17]
    k_cache = torch.randn(8 * bs, hkv, d)
    v_cache = torch.randn(8 * bs, hkv, d)
    q = torch.randn(4, hq, d)
    md = build_flat_pa_metadata(tables, lens, bs, 4, 8 if contiguous else 10, pad_block_id=7,
                                contiguous=contiguous)
    out = flat_paged_attention(q, k_cache, v_cache, md, 0.3, cap, window)
    layer = SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_size=d, scale=0.3,
                            logits_soft_cap=cap, sliding_window=window)
    for i, (table, n) in enumerate(zip(tables, lens)):
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        ref = masked_attention(layer, q[i].reshape(1, -1), k_cache[slots].flatten(1),
                               v_cache[slots].flatten(1), torch.tensor([n - 1]),
                               torch.arange(n))
        torch.testing.assert_close(out[i].reshape(1, -1), ref, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()
