"""Sampling on the HPU in bucketed shapes, so every sampler graph is warmed and counted.

On Gaudi each new input shape of the sampler (or of a logprob gather) is a graph
compile, just like a new forward shape. The CPU path samples a `[num_sampled, V]`
gather of the passes' logits with metadata whose optional tensors come and go with
the requests' parameters: dozens of shapes. Here instead:

- every pass is sampled on its own bucket's `[B, V]` logits (no gather): rows that
  do not sample (padding, a prompt chunk before its end) get a dummy greedy row;
- the random-path tensors (temperature, greedy mask, top-k, top-p, min-p) are
  always present, with neutral values (top_k 0, top_p 1, min_p 0) where unused, so
  a batch has one of two shapes: "argmax" (every row takes the raw argmax) or
  "full";
- the top-K of logprobs is computed for K rounded up to a power of two
  (`logprobs_bucket`), and each request keeps its own K;
- the logit processing is always there, dense, in one shape per bucket: penalties on
  every row (neutral values, repetition 1 and frequency / presence 0, on rows
  without), reading the persistent batch's [rows, vocab] count table, which the
  runner allocates up front; allowed_token_ids and min_tokens as one [B, V] mask
  (both set -inf before the bias, so folding them is exact); logit_bias as a dense
  [B, V] add.

So a bucket's sampler has one "full" shape per logprob bucket, whatever the requests
ask for, and warmup runs the argmax and every full shape, the logprob buckets and
prompt logprobs at every bucket size (see warmup.py): penalties, logit_bias,
min_tokens and allowed_token_ids compile nothing while serving. The price is a few
[B, V] elementwise ops on every full (non-argmax) sampling step.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Hashable, Optional, Sequence

import torch

from vllm.sample.metadata import PADDING_ROW, PenaltyInputs, SamplingMetadata, SamplingRow
from vllm.sample.ops.logit_masks import apply_bad_words
from vllm.sampling_params import SamplingParams

DUMMY_ROW = PADDING_ROW
"""What a row that samples nothing (padding, an unfinished prompt chunk) is given."""


def pow2_at_least(n: int, minimum: int = 1) -> int:
    return max(minimum, 1 << max(0, n - 1).bit_length())


def logprobs_bucket(num_logprobs: Optional[int], vocab_size: int) -> Optional[int]:
    """The top-K actually computed for a batch whose largest request asks for
    `num_logprobs` (None: no logprobs; 0: the sampled token only)."""
    if num_logprobs is None or num_logprobs == 0:
        return num_logprobs
    return min(pow2_at_least(num_logprobs), vocab_size)


def logprobs_buckets(max_logprobs: int, vocab_size: int) -> list[int]:
    """Every bucket `logprobs_bucket` gives for 0..max_logprobs (what warmup runs);
    `max_logprobs` < 0 (no cap) warms up to 20, vLLM's default cap."""
    top = max_logprobs if max_logprobs >= 0 else 20
    return sorted({logprobs_bucket(k, vocab_size) for k in range(0, top + 1)})


def static_metadata(rows: Sequence[SamplingRow], vocab_size: int,
                    device: torch.device | str,
                    token_stats: Optional[torch.Tensor] = None) -> SamplingMetadata:
    """`SamplingMetadata.build` for a bucket's rows, in the fixed shapes of the module
    doc (see `fixed_shapes`)."""
    return fixed_shapes(SamplingMetadata.build(rows, vocab_size, device), device,
                        token_stats)


def fixed_shapes(md: SamplingMetadata, device: torch.device | str,
                 token_stats: Optional[torch.Tensor] = None) -> SamplingMetadata:
    """`md` in the fixed shapes of the module doc (never the all-greedy or all-random
    shortcuts: one "full" shape). What the runner's persistent batch applies once to
    the metadata it caches (`InputBatch.sampling_metadata`). `token_stats`: the
    penalty count table neutral penalties read when no row has penalties (the one the
    batch's penalized rows use, so both have one shape); without it, a batch without
    penalties has none."""
    n = md.num_rows
    if md.temperature is None:
        md.temperature = torch.ones(n, dtype=torch.float32, device=device)
    if md.greedy_mask is None:
        md.greedy_mask = torch.full((n,), md.all_greedy, dtype=torch.bool, device=device)
    if md.top_k is None:
        md.top_k = torch.zeros(n, dtype=torch.int64, device=device)
    if md.top_p is None:
        md.top_p = torch.ones(n, dtype=torch.float32, device=device)
    if md.min_p is None:
        md.min_p = torch.zeros(n, dtype=torch.float32, device=device)
    md.all_greedy = md.all_random = False
    md.max_num_logprobs = logprobs_bucket(md.max_num_logprobs, md.vocab_size)
    if md.penalties is not None:
        md.penalties = _every_row(md.penalties, n)
    elif token_stats is not None:
        md.penalties = _neutral_penalties(n, token_stats)
    md.allowed_token_mask = _dense_mask(md, device)
    md.min_tokens_mask = None
    md.bad_words = None  # folded into the mask: the batch rebuilds it each step they apply
    md.dense_logit_bias = _dense_bias(md, device)
    md.logit_bias = None
    return md


def _dense_mask(md: SamplingMetadata, device: torch.device | str) -> torch.Tensor:
    """allowed_token_ids, min_tokens and the bad words' next tokens (as of now) as one
    [N, V] bool mask (True: -inf)."""
    mask = md.allowed_token_mask
    if mask is None:
        mask = torch.zeros(md.num_rows, md.vocab_size, dtype=torch.bool, device=device)
    if md.min_tokens_mask is not None:
        rows, tokens = md.min_tokens_mask
        mask = mask.clone()
        mask[rows, tokens] = True
    if md.bad_words is not None:
        banned = apply_bad_words(torch.zeros(md.num_rows, md.vocab_size, device=device),
                                 md.bad_words)
        mask = mask | torch.isneginf(banned)
    return mask


def _dense_bias(md: SamplingMetadata, device: torch.device | str) -> torch.Tensor:
    """logit_bias as a [N, V] float32 add (zeros without)."""
    bias = torch.zeros(md.num_rows, md.vocab_size, dtype=torch.float32, device=device)
    if md.logit_bias is not None:
        rows, tokens, values = md.logit_bias
        bias.index_put_((rows, tokens), values.to(torch.float32), accumulate=True)
    return bias


def _neutral_penalties(num_rows: int, token_stats: torch.Tensor) -> PenaltyInputs:
    """Penalties that change nothing (repetition 1, frequency and presence 0) on every
    row, reading row 0 of the batch's count table: the shape of real ones."""
    device = token_stats.device
    return PenaltyInputs(rows=torch.arange(num_rows, device=device),
                         table_rows=torch.zeros(num_rows, dtype=torch.int64, device=device),
                         token_stats=token_stats, seen_tokens=[],
                         repetition=torch.ones(num_rows, dtype=torch.float32, device=device),
                         frequency=torch.zeros(num_rows, dtype=torch.float32, device=device),
                         presence=torch.zeros(num_rows, dtype=torch.float32, device=device))


def _every_row(p: PenaltyInputs, num_rows: int) -> PenaltyInputs:
    """Penalties on all `num_rows` rows, for the whole-row path: neutral values
    (repetition 1, frequency and presence 0, which leave every logit as it is) on rows
    without penalties; no per-row seen-token lists (not a fixed shape, not needed)."""
    def spread(values: torch.Tensor, neutral: float) -> torch.Tensor:
        return values.new_full((num_rows,), neutral).index_copy_(0, p.rows, values)

    return PenaltyInputs(rows=torch.arange(num_rows, device=p.rows.device),
                         table_rows=spread(p.table_rows, 0),
                         token_stats=p.token_stats, seen_tokens=[],
                         repetition=spread(p.repetition, 1.0),
                         frequency=spread(p.frequency, 0.0),
                         presence=spread(p.presence, 0.0))


def _signature(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, PenaltyInputs):
        return _signature(tuple(getattr(value, f.name) for f in fields(value)))
    if isinstance(value, dict):
        return "generators"  # per-row draws of one fixed shape [V]; not a graph input
    return value


def sampler_signature(logits: torch.Tensor, md: Optional[SamplingMetadata]) -> Hashable:
    """What a sampler graph is keyed on: the logits' shape and every metadata field's
    shape (or value, for flags and the logprob bucket). None: the argmax path."""
    if md is None:
        return ("argmax", _signature(logits))
    return ("sampler", _signature(logits),
            tuple((f.name, _signature(getattr(md, f.name))) for f in fields(md)))


def padded_rows(rows: dict[int, SamplingRow], batch_size: int) -> list[SamplingRow]:
    """One row per bucket row: `rows[i]` where given, DUMMY_ROW elsewhere."""
    return [rows.get(i, DUMMY_ROW) for i in range(batch_size)]


def warmup_metadata(batch_size: int, vocab_size: int, num_logprobs: Optional[int],
                    device: torch.device | str,
                    token_stats: Optional[torch.Tensor] = None) -> SamplingMetadata:
    """The "full" metadata of a dummy batch (one random row, logprobs as given)."""
    params = SamplingParams(temperature=1.0, logprobs=num_logprobs)
    rows = {0: SamplingRow(params, (), ())}
    return static_metadata(padded_rows(rows, batch_size), vocab_size, device, token_stats)
