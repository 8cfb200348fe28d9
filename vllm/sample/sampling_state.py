"""Per-row sampling state in preallocated tensors, and the metadata read from it.

A `SamplingState` has a fixed number of rows. Each row holds one request's knobs
(temperature, top-k/p, min-p, penalties) in CPU tensors, its `SamplingRow` (params,
token lists, seeded generator) and, for penalized rows, its rows of the penalty
tables. Rows are written when a request gets one and copied when a request moves
(`move_row`); nothing is rebuilt per step. `metadata(rows)` gathers any list of rows
(in any order, a row repeated or not) into a `SamplingMetadata` for logits whose
row i belongs to state row rows[i].
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.metadata import (PenaltyInputs, SamplingMetadata, SamplingRow,
                                  build_allowed_mask, build_bad_words, build_logit_bias,
                                  build_min_tokens,
                                  is_greedy)
from vllm.sample.penalty_tables import PenaltyTables
from vllm.sampling_params import SamplingParams


def is_penalized(params: SamplingParams) -> bool:
    return (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
            or params.repetition_penalty != 1.0)


class SamplingState:

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.rows: list[Optional[SamplingRow]] = [None] * num_rows
        self.penalized: list[bool] = [False] * num_rows
        self.temperature = torch.ones(num_rows, dtype=torch.float32)
        """1.0 on greedy rows (the sampler divides every row)."""
        self.top_k = torch.zeros(num_rows, dtype=torch.int64)
        self.top_p = torch.ones(num_rows, dtype=torch.float32)
        self.min_p = torch.zeros(num_rows, dtype=torch.float32)
        self.repetition = torch.ones(num_rows, dtype=torch.float32)
        self.frequency = torch.zeros(num_rows, dtype=torch.float32)
        self.presence = torch.zeros(num_rows, dtype=torch.float32)
        self.penalty_tables: Optional[PenaltyTables] = None
        """Allocated by the first `metadata` call that reads a penalized row."""

    @classmethod
    def from_rows(cls, rows: Sequence[SamplingRow]) -> "SamplingState":
        state = cls(max(1, len(rows)))
        for i, row in enumerate(rows):
            state.write_row(i, row)
        return state

    # ------------------------------------------------------------------ rows
    def _columns(self) -> tuple[torch.Tensor, ...]:
        return (self.temperature, self.top_k, self.top_p, self.min_p, self.repetition,
                self.frequency, self.presence)

    def write_row(self, index: int, row: SamplingRow) -> None:
        """Row `index` now samples for `row` (its token lists are read, not copied)."""
        p = row.params
        values = (1.0 if is_greedy(p) else p.temperature, p.top_k, p.top_p, p.min_p,
                  p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        for column, value in zip(self._columns(), values):
            column[index] = _fit(column, value)
        self.rows[index] = row
        self.penalized[index] = is_penalized(p)
        if self.penalty_tables is not None:
            if self.penalized[index]:
                self.penalty_tables.write_row(index, row.prompt_token_ids,
                                              row.output_token_ids)
            else:
                self.penalty_tables.clear_row(index)

    def clear_row(self, index: int) -> None:
        self.rows[index] = None
        self.penalized[index] = False
        if self.penalty_tables is not None:
            self.penalty_tables.clear_row(index)

    def move_row(self, src: int, dst: int) -> None:
        """Row `src`'s request moves to row `dst` (condense); `src` is freed."""
        for column in self._columns():
            column[dst] = column[src]
        self.rows[dst] = self.rows[src]
        self.penalized[dst] = self.penalized[src]
        if self.penalized[src] and self.penalty_tables is not None:
            self.penalty_tables.move_row(src, dst)
        self.clear_row(src)

    def record_tokens(self, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        """Count token_ids[i], just appended to row rows[i]'s output, in the penalty
        tables (the token lists themselves are the caller's)."""
        if self.penalty_tables is None:
            return
        pairs = [(r, t) for r, t in zip(rows, token_ids) if self.penalized[r]]
        if pairs:
            self.penalty_tables.add_tokens(*zip(*pairs))

    # -------------------------------------------------------------- metadata
    def metadata(self, rows: Sequence[int], vocab_size: int,
                 device: torch.device | str) -> SamplingMetadata:
        """Metadata for logits whose row i samples for state row rows[i]."""
        srows = [self.rows[r] for r in rows]
        params = [r.params for r in srows]
        greedy = [is_greedy(p) for p in params]
        md = SamplingMetadata(num_rows=len(rows), vocab_size=vocab_size,
                              all_greedy=all(greedy), all_random=not any(greedy))
        index = torch.tensor(rows, dtype=torch.int64)
        if not md.all_greedy:
            self._fill_random(md, index, srows, greedy, device)
        logprob_counts = [p.logprobs for p in params if p.logprobs is not None]
        md.max_num_logprobs = max(logprob_counts) if logprob_counts else None
        md.penalties = self._penalties(rows, vocab_size, device)
        md.allowed_token_mask = build_allowed_mask(params, vocab_size, device)
        md.min_tokens_mask = build_min_tokens(srows, vocab_size, device)
        md.logit_bias = build_logit_bias(params, vocab_size, device)
        md.bad_words = build_bad_words(srows)
        return md

    def _fill_random(self, md: SamplingMetadata, index: torch.Tensor,
                     srows: Sequence[SamplingRow], greedy: list[bool],
                     device: torch.device | str) -> None:
        """Temperature, truncation knobs and generators of the non-greedy rows."""
        random_params = [r.params for r, g in zip(srows, greedy) if not g]
        md.temperature = host_to_device(self.temperature.index_select(0, index),
                                        torch.float32, device)
        if not md.all_random:
            md.greedy_mask = host_to_device(greedy, torch.bool, device)
        if any(p.top_k > 0 for p in random_params):
            md.top_k = host_to_device(self.top_k.index_select(0, index), torch.int64, device)
            cuts = [r.params.top_k for r in srows if 0 < r.params.top_k < md.vocab_size]
            md.top_k_max = max(cuts, default=0)
            md.top_k_any_off = len(cuts) < len(srows)
        if any(p.top_p < 1.0 for p in random_params):
            md.top_p = host_to_device(self.top_p.index_select(0, index), torch.float32,
                                      device)
        if any(p.min_p > 0.0 for p in random_params):
            md.min_p = host_to_device(self.min_p.index_select(0, index), torch.float32,
                                      device)
        md.generators = {}
        for i, (r, g) in enumerate(zip(srows, greedy)):
            if g:
                continue
            if r.generator is not None:
                md.generators[i] = r.generator
            elif r.params.seed is not None:
                raise ValueError(
                    f"row {i} has seed={r.params.seed} but no generator: create one per "
                    "request with make_generator(seed, device) and pass it in every step's "
                    "SamplingRow")

    def _penalties(self, rows: Sequence[int], vocab_size: int,
                   device: torch.device | str) -> Optional[PenaltyInputs]:
        local = [i for i, r in enumerate(rows) if self.penalized[r]]
        if not local:
            return None
        tables = self.penalty_tables_for(vocab_size, device)
        table_rows = torch.tensor([rows[i] for i in local], dtype=torch.int64)
        knobs = torch.stack([column.index_select(0, table_rows) for column in
                             (self.repetition, self.frequency, self.presence)])
        repetition, frequency, presence = host_to_device(knobs, torch.float32, device)
        return PenaltyInputs(
            rows=host_to_device(local, torch.int64, device),
            table_rows=host_to_device(table_rows, torch.int64, device),
            token_stats=tables.token_stats, seen_tokens=[tables.seen[rows[i]] for i in local],
            repetition=repetition, frequency=frequency, presence=presence)

    def penalty_tables_for(self, vocab_size: int, device: torch.device | str) -> PenaltyTables:
        """The tables, allocated (and every penalized row written) on first use."""
        tables = self.penalty_tables
        if (tables is None or tables.vocab_size != vocab_size
                or tables.device != torch.device(device)):
            tables = PenaltyTables(self.num_rows, vocab_size, device)
            for i, row in enumerate(self.rows):
                if self.penalized[i]:
                    tables.write_row(i, row.prompt_token_ids, row.output_token_ids)
            self.penalty_tables = tables
        return tables


_F32_MAX = float(torch.finfo(torch.float32).max)


def _fit(column: torch.Tensor, value: float) -> float:
    """`value` clamped into a float32 column's finite range: SamplingParams accepts any
    finite float (temperature=1e300 samples uniformly, as in vLLM), which a float32
    tensor cannot hold (torch raises: the engine loop would die on a request knob)."""
    if column.dtype == torch.float32:
        return max(-_F32_MAX, min(_F32_MAX, float(value)))
    return value
