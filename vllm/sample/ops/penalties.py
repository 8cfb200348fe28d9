"""Repetition, frequency and presence penalties (vLLM / OpenAI / HF semantics)."""
from __future__ import annotations

from typing import Optional

import torch


def apply_penalties(logits: torch.Tensor, output_counts: torch.Tensor,
                    seen_mask: Optional[torch.Tensor], presence: torch.Tensor,
                    frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """Penalize tokens already seen; all tensors cover the same M rows.

    - repetition (HF): a token in the prompt or the output has its logit divided by
      the penalty when positive and multiplied by it when negative (so >1 always makes
      it less likely); needs `seen_mask`, skipped when it is None.
    - frequency (OpenAI): subtract penalty * count of the token in the output.
    - presence (OpenAI): subtract penalty once if the token is in the output.
    Returns a new [M, V] tensor.
    """
    if seen_mask is not None:
        rep = repetition.unsqueeze(1)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen_mask, penalized, logits)
    logits = logits - frequency.unsqueeze(1) * output_counts
    logits = logits - presence.unsqueeze(1) * (output_counts > 0).to(logits.dtype)
    return logits
