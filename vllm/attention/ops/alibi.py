"""ALiBi (Press et al., "Train Short, Test Long"): a per-head linear bias on the
attention scores instead of position embeddings.

Head h adds `slope[h] * (k_pos - q_pos)` to the score of a query at `q_pos` for the
key at `k_pos`. BLOOM adds `slope[h] * k_pos` instead; the two differ by a constant
per query row, which the softmax removes, so either form gives the same output.
"""
from __future__ import annotations

import math

import torch


def get_alibi_slopes(total_num_heads: int) -> torch.Tensor:
    """[total_num_heads] float32 slopes, as BLOOM and transformers compute them.

    For n = 2^k heads: the geometric sequence r, r^2, ..., r^n with r = 2^(-8/n).
    Otherwise the sequence of the largest power of two p < n, followed by the odd
    powers r'^1, r'^3, ... of r' = 2^(-8/(2p)) for the n - p remaining heads (the
    slopes of 2p heads that the first p skipped).
    """
    if total_num_heads < 1:
        raise ValueError(f"total_num_heads must be >= 1, got {total_num_heads}.")
    p = 2 ** math.floor(math.log2(total_num_heads))
    base = torch.tensor(2.0 ** (-8.0 / p), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, p + 1, dtype=torch.int32))
    if p != total_num_heads:
        extra_base = torch.tensor(2.0 ** (-8.0 / (2 * p)), dtype=torch.float32)
        extra = torch.arange(1, 2 * (total_num_heads - p) + 1, 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra)])
    return slopes


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """float32 bias [H, Tq, Tk] = slope[h] * (k_pos - q_pos) for positions q_pos [Tq],
    k_pos [Tk]."""
    rel = (k_pos[None, :] - q_pos[:, None]).to(torch.float32)
    return slopes.to(torch.float32).view(-1, 1, 1) * rel
