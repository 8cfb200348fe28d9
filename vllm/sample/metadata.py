"""The sampler's inputs for one batch of logits rows (`SamplingMetadata`).

Everything optional is None when no row of the batch needs it, so the common cases
(all greedy, plain temperature sampling) build and run almost nothing. Per-row
values come from a `SamplingState` (preallocated per-row tensors, see
sampling_state.py); the persistent input batch keeps one and caches the metadata
until its requests change, and `SamplingMetadata.build` makes a fresh one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Optional, Sequence

import torch

from vllm.sample.host_copy import host_to_device
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


def needs_only_argmax(params: SamplingParams, num_output_tokens: int) -> bool:
    """True when the row's token is the plain argmax of the raw logits.

    Greedy, no logprobs, and nothing that edits the logits (penalties, bias,
    allowed ids, or a min_tokens still in force). A batch of such rows skips
    `SamplingMetadata.build` and the sampler entirely (see `greedy_sample`).
    """
    return (is_greedy(params) and params.logprobs is None and not params.logit_bias
            and params.allowed_token_ids is None and not params.bad_words
            and params.presence_penalty == 0.0
            and params.frequency_penalty == 0.0 and params.repetition_penalty == 1.0
            and num_output_tokens >= params.min_tokens)


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax (the first index among ties, as `argmax`).

    On the CPU platform a native kernel (vllm/native: one pass of vector compares, ~10x
    torch's bf16 reduction over a 49k vocabulary); elsewhere, and on the fake HPU, whose
    path must stay Gaudi's, `max(dim).indices`: on CPU, torch's argmax over bf16 logits
    runs a scalar loop about 4x slower than the max reduction; both return the first
    maximal index.
    """
    if logits.device.type == "cpu" and _cpu_platform():
        from vllm.native import cpu_ops
        ids = cpu_ops.argmax(logits)
        if ids is not None:
            return ids
    return logits.max(dim=-1).indices


def _cpu_platform() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


@dataclass
class PenaltyInputs:
    """What the penalties need: the penalized logits rows, their rows of the token
    tables, and each row's three penalties.

    The tables (`penalty_tables.py`) hold, per table row, each token's output count
    and prompt presence (`token_stats`) and the distinct seen tokens (`seen_tokens`,
    one entry per penalized row). In the persistent batch they are the batch's own,
    updated in place each step, so cached metadata stays current.
    """
    rows: torch.Tensor  # [R] int64 logits row
    table_rows: torch.Tensor  # [R] int64 row of token_stats
    token_stats: torch.Tensor  # [T, V] int32: 2 * output count + (1 if in the prompt)
    seen_tokens: list  # [R] SeenTokens (empty in fixed shapes: the whole-row path)
    repetition: torch.Tensor  # [R] float32 (1.0: no repetition penalty)
    frequency: torch.Tensor  # [R] float32
    presence: torch.Tensor  # [R] float32


@dataclass
class SamplingMetadata:
    """The batch's sampling inputs as tensors on the logits' device (see `build`).

    all_greedy / all_random let the sampler skip the random path or the argmax; each
    optional field is None when no row uses that feature.
    """
    num_rows: int
    vocab_size: int
    all_greedy: bool
    all_random: bool
    temperature: Optional[torch.Tensor] = None  # [N] float32; 1.0 on greedy rows
    greedy_mask: Optional[torch.Tensor] = None  # [N] bool; None if all greedy or all random
    top_k: Optional[torch.Tensor] = None  # [N] int64, 0 = off
    # Host facts about `top_k`, set with it (`SamplingState`): class attributes, not
    # dataclass fields, because they are no graph input (HPU keys its sampler graphs
    # on the fields) and change with the requests.
    top_k_max = None
    """Optional[int]: the largest top_k among rows where it cuts (0 < k < vocab), 0 if
    none; None when unknown (then read from `top_k`, a host sync on a GPU)."""
    top_k_any_off = None
    """Optional[bool]: whether some row of `top_k` does not cut; None when unknown."""
    top_p: Optional[torch.Tensor] = None  # [N] float32
    min_p: Optional[torch.Tensor] = None  # [N] float32
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: Optional[int] = None
    penalties: Optional[PenaltyInputs] = None
    allowed_token_mask: Optional[torch.Tensor] = None  # [N, V] bool, True = not allowed
    min_tokens_mask: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (rows, token ids)
    logit_bias: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    # (rows, token ids, bias values)
    bad_words: Optional[list[tuple[int, list[list[int]], list[int]]]] = None
    """(logits row, the request's bad-word token sequences, its output token list, read
    live at each step) per row with bad_words."""
    dense_logit_bias: Optional[torch.Tensor] = None
    """[N, V] float32 added to the logits after the masks: `logit_bias` in a fixed
    shape (static-shape sampling, vllm/hpu/sampling.py)."""

    @property
    def needs_logit_processing(self) -> bool:
        """Whether anything changes the logits before the greedy argmax."""
        return (self.allowed_token_mask is not None or self.min_tokens_mask is not None
                or self.logit_bias is not None or self.penalties is not None
                or self.dense_logit_bias is not None or self.bad_words is not None)

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> "SamplingMetadata":
        """From scratch: the rows written into fresh tables (what the persistent batch
        keeps from step to step, see `SamplingState`), then read back."""
        from vllm.sample.sampling_state import SamplingState
        state = SamplingState.from_rows(rows)
        return state.metadata(list(range(len(rows))), vocab_size, device)


# ---------------------------------------------------------------------- builders
# Fields built from the rows' params whenever the batch changes (not per step).


def flat_tokens(seqs: Sequence[Sequence[int]], vocab_size: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) of every in-vocabulary token of `seqs`, as two flat tensors."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    tokens = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.int64)
    row_ids = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
    keep = (tokens >= 0) & (tokens < vocab_size)
    return (host_to_device(row_ids[keep], torch.int64, device),
            host_to_device(tokens[keep], torch.int64, device))


def build_allowed_mask(params: Sequence[SamplingParams], vocab_size: int,
                       device: torch.device | str) -> Optional[torch.Tensor]:
    users = [i for i, p in enumerate(params) if p.allowed_token_ids is not None]
    if not users:
        return None
    mask = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
    mask[users] = True
    allowed = [[t for t in params[i].allowed_token_ids if t < vocab_size] for i in users]
    row_ids, tokens = flat_tokens(allowed, vocab_size, device)
    mask[host_to_device(users, torch.int64, device)[row_ids], tokens] = False
    return mask


def build_min_tokens(rows: Sequence[SamplingRow], vocab_size: int,
                     device: torch.device | str) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(rows, stop token ids) to forbid while a row has fewer than min_tokens outputs."""
    row_ids: list[int] = []
    token_ids: list[int] = []
    for i, r in enumerate(rows):
        if min_tokens_in_force(r):
            stops = [t for t in r.params.all_stop_token_ids if t < vocab_size]
            row_ids.extend([i] * len(stops))
            token_ids.extend(stops)
    if not row_ids:
        return None
    return (host_to_device(row_ids, torch.int64, device),
            host_to_device(token_ids, torch.int64, device))


def min_tokens_in_force(row: SamplingRow) -> bool:
    """Whether the row's stop tokens are still forbidden (fewer than min_tokens outputs)."""
    return bool(row.params.min_tokens) and len(row.output_token_ids) < row.params.min_tokens


def build_bad_words(rows: Sequence[SamplingRow]
                    ) -> Optional[list[tuple[int, list[list[int]], list[int]]]]:
    """The rows with bad words: their sequences and (live) output token lists."""
    found = [(i, r.params.bad_words_token_ids, r.output_token_ids)
             for i, r in enumerate(rows) if r.params.bad_words_token_ids]
    return found or None


def build_logit_bias(params: Sequence[SamplingParams], vocab_size: int,
                     device: torch.device | str
                     ) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    row_ids: list[int] = []
    token_ids: list[int] = []
    values: list[float] = []
    for i, p in enumerate(params):
        for token, bias in (p.logit_bias or {}).items():
            if token < vocab_size:
                row_ids.append(i)
                token_ids.append(token)
                values.append(bias)
    if not row_ids:
        return None
    return (host_to_device(row_ids, torch.int64, device),
            host_to_device(token_ids, torch.int64, device),
            host_to_device(values, torch.float32, device))
