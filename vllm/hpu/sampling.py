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
- the logit processing is always there, in one shape per bucket: each knob of the
  table (vllm/sample/logits_processors/) gives its fixed form: the forbidding knobs
  (allowed_token_ids, min_tokens, bad_words) fold into one [B, V] mask and
  logit_bias into one dense [B, V] add (`DenseForms`), penalties run on every row
  (neutral values on rows without) reading the persistent batch's [rows, vocab]
  count table, which the runner allocates up front.

So a bucket's sampler has one "full" shape per logprob bucket, whatever the requests
ask for, and warmup runs the argmax and every full shape, the logprob buckets and
prompt logprobs at every bucket size (see warmup.py): penalties, logit_bias,
min_tokens and allowed_token_ids compile nothing while serving. The price is a few
[B, V] elementwise ops on every full (non-argmax) sampling step.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Hashable, Optional, Sequence

import torch

from vllm.sample.logits_processors import BUILTIN_PROCESSORS
from vllm.sample.logits_processors.dense import DENSE, DenseForms
from vllm.sample.metadata import PADDING_ROW, SamplingMetadata, SamplingRow
from vllm.sample.sampling_state import SamplingState, build_metadata
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
                    sampling: Optional[SamplingState] = None) -> SamplingMetadata:
    """`build_metadata` for a bucket's rows, in the fixed shapes of the module doc (see
    `fixed_shapes`)."""
    return fixed_shapes(build_metadata(rows, vocab_size, device), device, sampling)


def fixed_shapes(md: SamplingMetadata, device: torch.device | str,
                 sampling: Optional[SamplingState] = None) -> SamplingMetadata:
    """`md` in the fixed shapes of the module doc (never the all-greedy or all-random
    shortcuts: one "full" shape): every knob of the table in its fixed form. What the
    runner's persistent batch applies once to the metadata it caches
    (`InputBatch.sampling_metadata`). `sampling`: the batch's state, whose tables the
    neutral forms read (penalties: the count table penalized rows use, so both have
    one shape); without it, a batch without penalties has none."""
    dense = DenseForms.neutral(md.num_rows, md.vocab_size, device)
    own: dict[str, Any] = {}
    for processor in BUILTIN_PROCESSORS:
        if processor.stage == "probs":
            processor.fixed_form(None, md, dense)
            continue
        inputs = md.logits_inputs.get(processor.name)
        state = sampling.state_of(processor.name) if sampling is not None else None
        form = processor.fixed_form(inputs, md, dense, state)
        if form is not None:
            own[processor.name] = form
    md.all_greedy = md.all_random = False
    md.max_num_logprobs = logprobs_bucket(md.max_num_logprobs, md.vocab_size)
    md.logits_inputs = {DENSE: dense, **own}
    return md


def _signature(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    if is_dataclass(value):
        return _signature(tuple(getattr(value, f.name) for f in fields(value)))
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in value.items())
    return value


def sampler_signature(logits: torch.Tensor, md: Optional[SamplingMetadata]) -> Hashable:
    """What a sampler graph is keyed on: the logits' shape and every metadata field's
    shape (or value, for flags and the logprob bucket). None: the argmax path."""
    if md is None:
        return ("argmax", _signature(logits))
    # Generators: per-row draws of one fixed shape [V], not a graph input.
    return ("sampler", _signature(logits),
            tuple((f.name, _signature(getattr(md, f.name))) for f in fields(md)
                  if f.name != "generators"))


def padded_rows(rows: dict[int, SamplingRow], batch_size: int) -> list[SamplingRow]:
    """One row per bucket row: `rows[i]` where given, DUMMY_ROW elsewhere."""
    return [rows.get(i, DUMMY_ROW) for i in range(batch_size)]


def warmup_metadata(batch_size: int, vocab_size: int, num_logprobs: Optional[int],
                    device: torch.device | str,
                    sampling: Optional[SamplingState] = None) -> SamplingMetadata:
    """The "full" metadata of a dummy batch (one random row, logprobs as given): every
    knob in its fixed form, so it is the shape any served batch has."""
    params = SamplingParams(temperature=1.0, logprobs=num_logprobs)
    rows = {0: SamplingRow(params, (), ())}
    return static_metadata(padded_rows(rows, batch_size), vocab_size, device, sampling)
