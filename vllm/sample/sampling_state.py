"""Per-row sampling state in preallocated tensors, and the metadata read from it.

A `SamplingState` has a fixed number of rows. Each row holds one request's
`SamplingRow` (params, token lists, seeded generator) and, for every knob of the
table (logits_processors/) that keeps per-row state, that knob's values for the
row (CPU columns, the penalties' token tables). Rows are written when a request gets
one and copied when a request moves (`move_row`); nothing is rebuilt per step.
`metadata(rows)` gathers any list of rows (in any order, a row repeated or not)
into a `SamplingMetadata` for logits whose row i belongs to state row rows[i].
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from vllm.sample.logits_processors import BUILTIN_PROCESSORS
from vllm.sample.logits_processors.base import BuildContext, RowState
from vllm.sample.metadata import SamplingMetadata, SamplingRow, is_greedy


class SamplingState:

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.rows: list[Optional[SamplingRow]] = [None] * num_rows
        self.states: dict[str, RowState] = {}
        """Knob name -> its per-row state (knobs that keep one)."""
        for processor in BUILTIN_PROCESSORS:
            state = processor.new_state(num_rows)
            if state is not None:
                self.states[processor.name] = state

    @classmethod
    def from_rows(cls, rows: Sequence[SamplingRow]) -> "SamplingState":
        state = cls(max(1, len(rows)))
        for i, row in enumerate(rows):
            state.write_row(i, row)
        return state

    # ------------------------------------------------------------------ rows
    def write_row(self, index: int, row: SamplingRow) -> None:
        """Row `index` now samples for `row` (its token lists are read, not copied)."""
        self.rows[index] = row
        for state in self.states.values():
            state.write_row(index, row)

    def clear_row(self, index: int) -> None:
        self.rows[index] = None
        for state in self.states.values():
            state.clear_row(index)

    def move_row(self, src: int, dst: int) -> None:
        """Row `src`'s request moves to row `dst` (condense); `src` is freed."""
        self.rows[dst] = self.rows[src]
        for state in self.states.values():
            state.move_row(src, dst)
        self.clear_row(src)

    def record_tokens(self, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        """token_ids[i] was just appended to row rows[i]'s output (the token lists
        themselves are the caller's): knobs that count outputs follow."""
        for state in self.states.values():
            state.record_tokens(rows, token_ids)

    def state_of(self, name: str) -> Optional[RowState]:
        """The per-row state of the knob called `name` (None: it keeps none)."""
        return self.states.get(name)

    # -------------------------------------------------------------- metadata
    def metadata(self, rows: Sequence[int], vocab_size: int,
                 device: torch.device | str) -> SamplingMetadata:
        """Metadata for logits whose row i samples for state row rows[i]."""
        srows = [self.rows[r] for r in rows]
        greedy = [is_greedy(r.params) for r in srows]
        md = SamplingMetadata(num_rows=len(rows), vocab_size=vocab_size,
                              all_greedy=all(greedy), all_random=not any(greedy))
        ctx = BuildContext(rows, srows, greedy, torch.tensor(rows, dtype=torch.int64),
                           vocab_size, device, md, self.states)
        for processor in BUILTIN_PROCESSORS:
            if processor.stage == "probs":
                if not md.all_greedy:
                    processor.build(ctx)
                continue
            inputs = processor.build(ctx)
            if inputs is not None:
                md.logits_inputs[processor.name] = inputs
        logprob_counts = [r.params.logprobs for r in srows if r.params.logprobs is not None]
        md.max_num_logprobs = max(logprob_counts) if logprob_counts else None
        if not md.all_greedy:
            md.generators = _generators(srows, greedy)
        return md


def _generators(srows: Sequence[SamplingRow], greedy: list[bool]
                ) -> dict[int, torch.Generator]:
    """The seeded random rows' own generators, by logits row."""
    generators = {}
    for i, (r, g) in enumerate(zip(srows, greedy)):
        if g:
            continue
        if r.generator is not None:
            generators[i] = r.generator
        elif r.params.seed is not None:
            raise ValueError(
                f"row {i} has seed={r.params.seed} but no generator: create one per "
                "request with make_generator(seed, device) and pass it in every step's "
                "SamplingRow")
    return generators


def build_metadata(rows: Sequence[SamplingRow], vocab_size: int,
                   device: torch.device | str) -> SamplingMetadata:
    """From scratch: the rows written into a fresh state (what the persistent batch
    keeps from step to step), then read back."""
    state = SamplingState.from_rows(rows)
    return state.metadata(list(range(len(rows))), vocab_size, device)
