"""Repetition, frequency and presence penalties (vLLM / OpenAI / HF semantics).

For each penalized row and each token seen in its prompt or output:
- repetition (HF): divide a positive logit by the penalty, multiply a negative one
  (so a penalty > 1 always makes the token less likely);
- frequency (OpenAI): subtract penalty * count in the output;
- presence (OpenAI): subtract penalty once if the token is in the output.
Unseen tokens keep their logit. Both entry points compute the same values from the
same tables (`penalty_tables.py`): `apply_penalties` touches only the seen (row,
token) pairs (data-dependent sizes, cheapest on CPU), `apply_penalties_dense` the
penalized rows whole, in shapes that depend only on the batch (HPU graphs).
"""
from __future__ import annotations

import torch

from vllm.sample.metadata import PenaltyInputs


def apply_penalties(logits: torch.Tensor, pen: PenaltyInputs) -> torch.Tensor:
    """Penalize the seen (row, token) pairs of `logits` in place (each penalized row's
    `seen_tokens`, counts read from `token_stats`)."""
    parts = [seen.tokens() for seen in pen.seen_tokens]
    token_ids = torch.cat(parts)
    lengths = torch.tensor([p.shape[0] for p in parts], device=pen.rows.device)
    local = torch.repeat_interleave(torch.arange(len(parts), device=pen.rows.device),
                                    lengths)
    stats = pen.token_stats[pen.table_rows[local], token_ids]
    rows = pen.rows[local]
    values = penalized_values(logits[rows, token_ids], (stats >> 1).float(),
                              pen.repetition[local], pen.frequency[local],
                              pen.presence[local])
    logits[rows, token_ids] = values
    return logits


def apply_penalties_dense(logits: torch.Tensor, pen: PenaltyInputs) -> torch.Tensor:
    """`apply_penalties` on the penalized rows whole, in place (fixed shapes)."""
    stats = pen.token_stats.index_select(0, pen.table_rows)
    values = logits.index_select(0, pen.rows)
    penalized = penalized_values(values, (stats >> 1).float(), pen.repetition.unsqueeze(1),
                                 pen.frequency.unsqueeze(1), pen.presence.unsqueeze(1))
    logits.index_copy_(0, pen.rows, torch.where(stats != 0, penalized, values))
    return logits


def penalized_values(values: torch.Tensor, output_counts: torch.Tensor,
                     repetition: torch.Tensor, frequency: torch.Tensor,
                     presence: torch.Tensor) -> torch.Tensor:
    """The penalized logits of seen tokens (elementwise; the one formula of both paths)."""
    values = torch.where(values > 0, values / repetition, values * repetition)
    return values - frequency * output_counts - presence * (output_counts > 0).float()
