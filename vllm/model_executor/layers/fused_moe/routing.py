"""Top-k expert selection from router logits."""
from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                   scoring_func: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, k] float32, topk_ids [T, k] int64) for router logits [T, E].

    Scores are the softmax over all experts (in float32, as HF computes them); the k
    highest are kept. `renormalize` rescales the kept k to sum to 1 (Mixtral, and
    Qwen-MoE configs with `norm_topk_prob`); otherwise they keep their share of the
    full softmax (Qwen1.5/2-MoE's default).
    """
    if scoring_func == "softmax":
        scores = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    elif scoring_func == "sigmoid":
        scores = torch.sigmoid(router_logits.float())
    else:
        raise ValueError(f"scoring_func must be 'softmax' or 'sigmoid', got {scoring_func!r}.")
    weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
