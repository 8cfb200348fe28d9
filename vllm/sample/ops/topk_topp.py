"""Truncation of the distribution: min-p, top-k and top-p (nucleus).

Each sets the logits of the dropped tokens to -inf, in place, and never drops the most
likely token. Rows whose knob is off (top_k 0, top_p 1, min_p 0) are left untouched.
"""
from __future__ import annotations

from typing import Optional

import torch


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: Optional[torch.Tensor],
                      top_p: Optional[torch.Tensor]) -> torch.Tensor:
    """Keep the top_k most likely tokens, then the smallest set reaching mass top_p.

    top_p is measured on the distribution left after top_k, as in vLLM. Ties at the
    k-th logit are all kept.
    """
    if top_p is None:
        return logits if top_k is None else _apply_top_k_only(logits, top_k)
    vocab_size = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        k = torch.where((top_k <= 0) | (top_k >= vocab_size),
                        torch.full_like(top_k, vocab_size), top_k)
        kth = sorted_logits.gather(1, (vocab_size - k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # A token goes when it and everything less likely hold at most 1 - top_p of the mass.
    drop = cumulative <= (1.0 - top_p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, float("-inf"))
    return logits.scatter_(1, order, sorted_logits)


def _apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """top-k without a full sort: threshold each row at its k-th largest logit."""
    vocab_size = logits.shape[-1]
    off = (top_k <= 0) | (top_k >= vocab_size)
    k = top_k.masked_fill(off, 1)
    max_k = int(k.max())
    top_values = logits.topk(max_k, dim=-1).values
    kth = top_values.gather(1, (k - 1).unsqueeze(1))
    kth.masked_fill_(off.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))
