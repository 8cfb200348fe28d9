"""The sampler's inputs for one batch of logits rows (`SamplingMetadata`).

Everything optional is None (or absent) when no row of the batch needs it, so the
common cases (all greedy, plain temperature sampling) build and run almost nothing.
Which knob fills what is decided by the table of logits processors
(vllm/sample/logits_processors/): this module only holds the result. Per-row values
come from a `SamplingState` (sampling_state.py); the persistent input batch keeps one
and caches the metadata until its requests change, and `build_metadata` makes a fresh
one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from vllm.model_executor.kernels import kernel
from vllm.sampling_params import _SAMPLING_EPS, SamplingParams


@dataclass
class SamplingRow:
    """One logits row: its request's params, token history and random generator.

    `generator` is the request's own generator when it has a seed (created once per
    request with `make_generator`, so its draws continue across steps); None otherwise.
    """
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: Optional[torch.Generator] = None


PADDING_ROW = SamplingRow(SamplingParams(temperature=0.0), (), ())
"""What a logits row that samples nothing (fixed-shape padding) is given: greedy,
no knob, so the sampler leaves it alone."""


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The per-request generator of a seeded request."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def is_greedy(params: SamplingParams) -> bool:
    """Rows sampled by argmax: temperature ~0, or top_k=1 (which can only keep the max)."""
    return params.temperature < _SAMPLING_EPS or params.top_k == 1


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax (the first index among ties, as `argmax`).

    The platform's `argmax` kernel where it has one (model_executor/kernels.py; the
    CPU's: one pass of vector compares, ~10x torch's bf16 reduction over a 49k
    vocabulary); elsewhere, and on the fake HPU, whose path must stay Gaudi's,
    `max(dim).indices`: on CPU, torch's argmax over bf16 logits runs a scalar loop
    about 4x slower than the max reduction; both return the first maximal index.
    """
    ids = kernel("argmax")(logits)
    return logits.max(dim=-1).indices if ids is None else ids


@dataclass
class SamplingMetadata:
    """The batch's sampling inputs as tensors on the logits' device (see
    `SamplingState.metadata`).

    all_greedy / all_random let the sampler skip the random path or the argmax. The
    random path's tensors (temperature, top-k/p, min-p: what `compute_probs` reads, here
    and in the rejection sampler) are fields; the inputs of the knobs that edit the
    logits before the argmax live in `logits_inputs`, by processor name, so a new knob
    needs no field here.
    """
    num_rows: int
    vocab_size: int
    all_greedy: bool
    all_random: bool
    temperature: Optional[torch.Tensor] = None  # [N] float32; 1.0 on greedy rows
    greedy_mask: Optional[torch.Tensor] = None  # [N] bool; None if all greedy or all random
    top_k: Optional[torch.Tensor] = None  # [N] int64, 0 = off
    # Host facts about `top_k`, set with it: class attributes, not dataclass fields,
    # because they are no graph input (HPU keys its sampler graphs on the fields) and
    # change with the requests.
    top_k_max = None
    """Optional[int]: the largest top_k among rows where it cuts (0 < k < vocab), 0 if
    none; None when unknown (then read from `top_k`, a host sync on a GPU)."""
    top_k_any_off = None
    """Optional[bool]: whether some row of `top_k` does not cut; None when unknown."""
    top_p: Optional[torch.Tensor] = None  # [N] float32
    min_p: Optional[torch.Tensor] = None  # [N] float32
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: Optional[int] = None
    logits_inputs: dict[str, Any] = field(default_factory=dict)
    """Processor name -> its inputs for this batch, in table order: only processors
    that some row uses (fixed shapes: every processor's neutral or dense form)."""

    @property
    def needs_logit_processing(self) -> bool:
        """Whether anything changes the logits before the greedy argmax."""
        return bool(self.logits_inputs)
