"""top-k / top-p / min-p ops against a float64 per-row reference, windowed and sorted paths."""
from __future__ import annotations

import pytest
import torch

from vllm.sample.ops import topk_topp
from vllm.sample.ops.topk_topp import apply_min_p, apply_top_k_top_p


def reference_kept(row: torch.Tensor, k: int, p: float) -> set[int]:
    vocab = row.numel()
    order = torch.argsort(row.double(), descending=True)
    if 0 < k < vocab:
        order = order[:k]
    probs = torch.softmax(row.double()[order], dim=-1)
    mass_before = probs.cumsum(0) - probs
    n = len(order) if p >= 1.0 else int((mass_before < p).sum())
    return set(order[:max(n, 1)].tolist())


@pytest.mark.parametrize("window", [8, 256])
def test_top_k_top_p_match_reference(monkeypatch, window):
    monkeypatch.setattr(topk_topp, "TOP_P_WINDOW", window)
    g = torch.Generator().manual_seed(0)
    rows, vocab = 48, 64
    # Peaked and flat rows, so some nuclei fit in the window and some do not.
    scale = torch.where(torch.arange(rows) % 2 == 0, 4.0, 0.3).unsqueeze(1)
    logits = torch.randn(rows, vocab, generator=g) * scale
    ks = torch.tensor([[0, 1, 3, 8, 20, 64][i % 6] for i in range(rows)])
    ps = torch.tensor([[1.0, 0.5, 0.9, 0.99][(i // 6) % 4] for i in range(rows)])
    out = apply_top_k_top_p(logits.clone(), ks, ps)
    for i in range(rows):
        kept = set(torch.nonzero(out[i] > float("-inf")).squeeze(1).tolist())
        assert kept == reference_kept(logits[i], int(ks[i]), float(ps[i])), (i, ks[i], ps[i])
        assert torch.equal(out[i][list(kept)], logits[i][list(kept)])


def test_top_k_only_and_top_p_only():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2, 0]), None)
    assert torch.isinf(out).tolist() == [[False, True, False, True], [False] * 4]
    probs = torch.tensor([[0.6, 0.25, 0.1, 0.05]])
    out = apply_top_k_top_p(probs.log(), None, torch.tensor([0.8]))
    assert torch.isinf(out).tolist() == [[False, False, True, True]]


def test_min_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]])
    out = apply_min_p(probs.log(), torch.tensor([0.2, 0.0]))
    assert torch.isinf(out).tolist() == [[False, False, False, True], [False] * 4]
