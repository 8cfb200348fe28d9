"""Per-step batch tensors for the sampler, built from one `SamplingRow` per logits row.

Everything optional is None when no row of the batch needs it, so the common cases
(all greedy, plain temperature sampling) build and run almost nothing. Token-history
tensors (penalties) are built from one flat tensor with `unique` / `index_add_`, never
a Python loop over tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Optional, Sequence

import torch

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
            and params.allowed_token_ids is None and params.presence_penalty == 0.0
            and params.frequency_penalty == 0.0 and params.repetition_penalty == 1.0
            and num_output_tokens >= params.min_tokens)


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax (the first index among ties, as `argmax`).

    `max(dim).indices` instead of `argmax`: on CPU, argmax over bf16 logits runs a
    scalar loop about 4x slower than the max reduction; both return the first
    maximal index.
    """
    return logits.max(dim=-1).indices


@dataclass
class PenaltyInputs:
    """Penalties as sparse (row, token) pairs: the tokens each penalized row has seen.

    Only seen tokens are penalized, so touching just those pairs replaces dense
    [rows, vocab] count tensors. Pairs are unique; per-pair values come from the row.
    """
    rows: torch.Tensor  # [P] int64 logits row
    token_ids: torch.Tensor  # [P] int64
    output_counts: torch.Tensor  # [P] float32: occurrences in the output (0: prompt only)
    repetition: torch.Tensor  # [P] float32 (1.0 where the row has no repetition penalty)
    frequency: torch.Tensor  # [P] float32
    presence: torch.Tensor  # [P] float32


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
    top_p: Optional[torch.Tensor] = None  # [N] float32
    min_p: Optional[torch.Tensor] = None  # [N] float32
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: Optional[int] = None
    penalties: Optional[PenaltyInputs] = None
    allowed_token_mask: Optional[torch.Tensor] = None  # [N, V] bool, True = not allowed
    min_tokens_mask: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (rows, token ids)
    logit_bias: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    # (rows, token ids, bias values)

    @property
    def needs_logit_processing(self) -> bool:
        """Whether anything changes the logits before the greedy argmax."""
        return (self.allowed_token_mask is not None or self.min_tokens_mask is not None
                or self.logit_bias is not None or self.penalties is not None)

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> "SamplingMetadata":
        params = [r.params for r in rows]
        greedy = [is_greedy(p) for p in params]
        md = cls(num_rows=len(rows), vocab_size=vocab_size,
                 all_greedy=all(greedy), all_random=not any(greedy))
        if not md.all_greedy:
            _fill_random(md, rows, greedy, device)
        logprob_counts = [p.logprobs for p in params if p.logprobs is not None]
        md.max_num_logprobs = max(logprob_counts) if logprob_counts else None
        md.penalties = _build_penalties(rows, vocab_size, device)
        md.allowed_token_mask = _build_allowed_mask(params, vocab_size, device)
        md.min_tokens_mask = _build_min_tokens(rows, vocab_size, device)
        md.logit_bias = _build_logit_bias(params, vocab_size, device)
        return md


# ---------------------------------------------------------------------- builders


def _fill_random(md: SamplingMetadata, rows: Sequence[SamplingRow], greedy: list[bool],
                 device: torch.device | str) -> None:
    """Temperature, truncation knobs and generators of the non-greedy rows."""
    params = [r.params for r in rows]
    random_params = [p for p, g in zip(params, greedy) if not g]
    md.temperature = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                                  dtype=torch.float32, device=device)
    if not md.all_random:
        md.greedy_mask = torch.tensor(greedy, dtype=torch.bool, device=device)
    if any(p.top_k > 0 for p in random_params):
        md.top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
    if any(p.top_p < 1.0 for p in random_params):
        md.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    if any(p.min_p > 0.0 for p in random_params):
        md.min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device)
    md.generators = {}
    for i, (r, g) in enumerate(zip(rows, greedy)):
        if g:
            continue
        if r.generator is not None:
            md.generators[i] = r.generator
        elif r.params.seed is not None:
            raise ValueError(
                f"row {i} has seed={r.params.seed} but no generator: create one per request "
                "with make_generator(seed, device) and pass it in every step's SamplingRow")


def _flat_tokens(seqs: Sequence[Sequence[int]], vocab_size: int,
                 device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) of every in-vocabulary token of `seqs`, as two flat tensors."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    tokens = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.int64)
    row_ids = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
    keep = (tokens >= 0) & (tokens < vocab_size)
    return row_ids[keep].to(device), tokens[keep].to(device)


def _build_penalties(rows: Sequence[SamplingRow], vocab_size: int,
                     device: torch.device | str) -> Optional[PenaltyInputs]:
    """Unique (row, token) pairs of the output (and of the prompt for repetition)."""
    idx = [i for i, r in enumerate(rows)
           if r.params.presence_penalty != 0.0 or r.params.frequency_penalty != 0.0
           or r.params.repetition_penalty != 1.0]
    if not idx:
        return None
    sel = [rows[i] for i in idx]
    out_rows, out_tokens = _flat_tokens([r.output_token_ids for r in sel], vocab_size, "cpu")
    # The prompt matters only to the repetition penalty.
    prompts = [r.prompt_token_ids if r.params.repetition_penalty != 1.0 else () for r in sel]
    prompt_rows, prompt_tokens = _flat_tokens(prompts, vocab_size, "cpu")
    keys = torch.cat([out_rows * vocab_size + out_tokens,
                      prompt_rows * vocab_size + prompt_tokens])
    pairs, inverse = torch.unique(keys, return_inverse=True)
    from_output = torch.zeros(len(keys), dtype=torch.float32)
    from_output[:len(out_rows)] = 1.0
    output_counts = torch.zeros(len(pairs), dtype=torch.float32).index_add_(0, inverse,
                                                                           from_output)
    local_rows = pairs // vocab_size

    def per_pair(name: str) -> torch.Tensor:
        values = torch.tensor([getattr(r.params, name) for r in sel], dtype=torch.float32)
        return values[local_rows].to(device)

    return PenaltyInputs(rows=torch.tensor(idx, dtype=torch.int64)[local_rows].to(device),
                         token_ids=(pairs % vocab_size).to(device),
                         output_counts=output_counts.to(device),
                         repetition=per_pair("repetition_penalty"),
                         frequency=per_pair("frequency_penalty"),
                         presence=per_pair("presence_penalty"))


def _build_allowed_mask(params: Sequence[SamplingParams], vocab_size: int,
                        device: torch.device | str) -> Optional[torch.Tensor]:
    users = [i for i, p in enumerate(params) if p.allowed_token_ids is not None]
    if not users:
        return None
    mask = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
    mask[users] = True
    allowed = [[t for t in params[i].allowed_token_ids if t < vocab_size] for i in users]
    row_ids, tokens = _flat_tokens(allowed, vocab_size, device)
    mask[torch.tensor(users, device=device)[row_ids], tokens] = False
    return mask


def _build_min_tokens(rows: Sequence[SamplingRow], vocab_size: int,
                      device: torch.device | str) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(rows, stop token ids) to forbid while a row has fewer than min_tokens outputs."""
    row_ids: list[int] = []
    token_ids: list[int] = []
    for i, r in enumerate(rows):
        if r.params.min_tokens and len(r.output_token_ids) < r.params.min_tokens:
            stops = [t for t in r.params.all_stop_token_ids if t < vocab_size]
            row_ids.extend([i] * len(stops))
            token_ids.extend(stops)
    if not row_ids:
        return None
    return (torch.tensor(row_ids, dtype=torch.int64, device=device),
            torch.tensor(token_ids, dtype=torch.int64, device=device))


def _build_logit_bias(params: Sequence[SamplingParams], vocab_size: int,
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
    return (torch.tensor(row_ids, dtype=torch.int64, device=device),
            torch.tensor(token_ids, dtype=torch.int64, device=device),
            torch.tensor(values, dtype=torch.float32, device=device))
