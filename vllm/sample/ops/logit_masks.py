"""Hard constraints and biases applied before penalties: allowed ids, min_tokens, logit_bias."""
from __future__ import annotations

from typing import Sequence

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


def apply_bad_words(logits: torch.Tensor,
                    entries: Sequence[tuple[int, Sequence[Sequence[int]], Sequence[int]]]
                    ) -> torch.Tensor:
    """Forbid each row's next token where it would complete a bad word: a one-token word
    always, a longer one when the output so far ends with all but its last token."""
    rows: list[int] = []
    tokens: list[int] = []
    vocab = logits.shape[-1]
    for row, sequences, output in entries:
        for seq in sequences:
            prefix = len(seq) - 1
            if seq[-1] < vocab and (prefix == 0 or (
                    len(output) >= prefix and list(output[-prefix:]) == list(seq[:-1]))):
                rows.append(row)
                tokens.append(seq[-1])
    if rows:
        index = (torch.tensor(rows, device=logits.device),
                 torch.tensor(tokens, device=logits.device))
        logits[index] = float("-inf")
    return logits
