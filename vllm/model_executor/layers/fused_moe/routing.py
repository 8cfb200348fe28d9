"""Top-k expert selection from router logits."""
from __future__ import annotations

from typing import Optional

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                   scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
                   topk_group: Optional[int] = None,
                   e_score_correction_bias: Optional[torch.Tensor] = None,
                   routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, k] float32, topk_ids [T, k] int64) for router logits [T, E].

    Scores are the softmax over all experts (in float32, as HF computes them) or the
    sigmoid of each logit; the k highest are kept. `renormalize` rescales the kept k to
    sum to 1 (Mixtral, and Qwen-MoE / DeepSeek-V3 configs with `norm_topk_prob`);
    otherwise they keep their share of the full softmax (Qwen1.5/2-MoE's, DeepSeek-V2's
    default). With `num_expert_group` the experts form that many groups and only the
    `topk_group` best groups compete (`grouped_topk`). The kept weights are multiplied by
    `routed_scaling_factor` (DeepSeek).
    """
    if scoring_func == "softmax":
        scores = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    elif scoring_func == "sigmoid":
        scores = torch.sigmoid(router_logits.float())
    else:
        raise ValueError(f"scoring_func must be 'softmax' or 'sigmoid', got {scoring_func!r}.")
    if num_expert_group:
        weights, ids = grouped_topk(scores, top_k, num_expert_group, topk_group or 1,
                                    e_score_correction_bias)
    elif e_score_correction_bias is not None:
        ids = torch.topk(scores + e_score_correction_bias.float(), top_k, dim=-1)[1]
        weights = scores.gather(1, ids)
    else:
        weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        denominator = weights.sum(dim=-1, keepdim=True)
        if e_score_correction_bias is not None:
            denominator = denominator + 1e-20  # sigmoid scores can all be ~0 (as HF)
        weights = weights / denominator
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids


def grouped_topk(scores: torch.Tensor, top_k: int, num_expert_group: int, topk_group: int,
                 e_score_correction_bias: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-limited top-k (DeepSeek): (weights, ids) from scores [T, E] float32.

    Without a correction bias (DeepSeek-V2's `group_limited_greedy`) a group scores its
    best expert; with one (V3's `noaux_tc`) the bias is added for the choice only and a
    group scores the sum of its two best biased experts. Experts outside the
    `topk_group` best groups are excluded; weights are the unbiased scores of the
    chosen experts.
    """
    t, e = scores.shape
    if e % num_expert_group:
        raise ValueError(f"the number of experts ({e}) must be divisible by n_group "
                         f"({num_expert_group}).")
    if e_score_correction_bias is None:
        choice = scores
        group_scores = choice.view(t, num_expert_group, -1).max(dim=-1).values
        fill = 0.0
    else:
        choice = scores + e_score_correction_bias.float()
        group_scores = choice.view(t, num_expert_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        fill = float("-inf")
    group_idx = torch.topk(group_scores, topk_group, dim=-1)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    expert_mask = group_mask[:, :, None].expand(t, num_expert_group, e // num_expert_group)
    choice = choice.masked_fill(~expert_mask.reshape(t, e).bool(), fill)
    if e_score_correction_bias is None:
        return torch.topk(choice, top_k, dim=-1)
    ids = torch.topk(choice, top_k, dim=-1)[1]
    return scores.gather(1, ids), ids
