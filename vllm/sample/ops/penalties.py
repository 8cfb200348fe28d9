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

from dataclasses import dataclass

import torch

from vllm.sample.host_copy import host_to_device


@dataclass
class PenaltyInputs:
    """What the penalties need: the penalized logits rows, their rows of the token
    tables, and each row's three penalties.

    The tables hold, per table row, each token's output count and prompt presence
    (`token_stats`) and the distinct seen tokens (`seen_tokens`, one entry per
    penalized row). In the persistent batch they are the batch's own, updated in place
    each step, so cached metadata stays current.
    """
    rows: torch.Tensor  # [R] int64 logits row
    table_rows: torch.Tensor  # [R] int64 row of token_stats
    token_stats: torch.Tensor  # [T, V] int32: 2 * output count + (1 if in the prompt)
    seen_tokens: list  # [R] SeenTokens (empty in fixed shapes: the whole-row path)
    repetition: torch.Tensor  # [R] float32 (1.0: no repetition penalty)
    frequency: torch.Tensor  # [R] float32
    presence: torch.Tensor  # [R] float32


def apply_penalties(logits: torch.Tensor, pen: PenaltyInputs) -> torch.Tensor:
    """Penalize the seen (row, token) pairs of `logits` (each penalized row's
    `seen_tokens`, counts read from `token_stats`): in place when `logits` is
    contiguous, else in a contiguous copy; returns the penalized tensor.

    Pairs are addressed by flat offsets (one `index_select` / `index_copy_` each) and
    the per-row values are expanded to pairs with one `repeat_interleave` per dtype:
    this runs every step over every seen pair, so it is kept to a few flat ops.
    """
    logits = logits.contiguous()  # flat offsets below (the sampler's copy already is)
    parts = [seen.tokens() for seen in pen.seen_tokens]
    token_ids = torch.cat(parts)
    # Lengths and their total from the host (`num_tokens`): no device read on a GPU.
    host_lengths = [seen.num_tokens for seen in pen.seen_tokens]
    total = sum(host_lengths)
    lengths = host_to_device(host_lengths, torch.int64, token_ids.device)
    row_starts = torch.stack([pen.rows * logits.shape[1],
                              pen.table_rows * pen.token_stats.shape[1]])
    logit_at, stat_at = (row_starts.repeat_interleave(lengths, dim=1, output_size=total)
                         + token_ids).unbind(0)
    knobs = torch.stack([pen.repetition, pen.frequency, pen.presence])
    repetition, frequency, presence = knobs.repeat_interleave(
        lengths, dim=1, output_size=total).unbind(0)
    counts = (pen.token_stats.view(-1).index_select(0, stat_at) >> 1).float()
    flat = logits.view(-1)
    values = penalized_values(flat.index_select(0, logit_at), counts, repetition, frequency,
                              presence)
    flat.index_copy_(0, logit_at, values)
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
