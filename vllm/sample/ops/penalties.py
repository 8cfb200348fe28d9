"""Repetition, frequency and presence penalties (vLLM / OpenAI / HF semantics)."""
from __future__ import annotations

import torch


def apply_penalties(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor,
                    output_counts: torch.Tensor, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """Penalize the seen (row, token) pairs of `logits` in place; pairs must be unique.

    Each pair is a token of the row's prompt or output; `output_counts` says how often
    it occurs in the output (0 for prompt-only tokens).
    - repetition (HF): divide a positive logit by the penalty, multiply a negative one
      (so a penalty > 1 always makes the token less likely);
    - frequency (OpenAI): subtract penalty * count in the output;
    - presence (OpenAI): subtract penalty once if the token is in the output.
    """
    values = logits[rows, token_ids]
    values = torch.where(values > 0, values / repetition, values * repetition)
    values = values - frequency * output_counts - presence * (output_counts > 0).float()
    logits[rows, token_ids] = values
    return logits
