"""Hard constraints and biases applied before penalties: allowed ids, min_tokens, logit_bias."""
from __future__ import annotations

import torch


def apply_allowed_token_mask(logits: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """Set -inf where `banned` ([N, V] bool) is True (tokens outside allowed_token_ids)."""
    return logits.masked_fill_(banned, float("-inf"))


def apply_min_tokens(logits: torch.Tensor, rows: torch.Tensor,
                     token_ids: torch.Tensor) -> torch.Tensor:
    """Forbid the stop tokens of rows that have not yet produced min_tokens tokens."""
    logits[rows, token_ids] = float("-inf")
    return logits


def apply_logit_bias(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor,
                     values: torch.Tensor) -> torch.Tensor:
    """Add each (row, token) bias (pairs are unique: one dict per row)."""
    return logits.index_put_((rows, token_ids), values, accumulate=True)
