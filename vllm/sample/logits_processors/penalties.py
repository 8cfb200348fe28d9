"""Repetition, frequency and presence penalties, one knob (vLLM / OpenAI / HF semantics).

Per-row state: the three penalties in CPU columns, and the penalty tables
(penalty_tables.py: each token's output count and prompt presence, written once per
row and then followed by one accumulate of the step's sampled tokens), allocated the
first time a penalized row is sampled.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.base import (BuildContext, BuiltinLogitsProcessor,
                                                ColumnState)
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import SamplingMetadata, SamplingRow
from vllm.sample.ops.penalties import PenaltyInputs, apply_penalties, apply_penalties_dense
from vllm.sample.penalty_tables import PenaltyTables
from vllm.sampling_params import SamplingParams


def is_penalized(params: SamplingParams) -> bool:
    return (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
            or params.repetition_penalty != 1.0)


class PenaltyState(ColumnState):
    """The penalties' columns, which rows are penalized, and the penalty tables."""

    def __init__(self, num_rows: int) -> None:
        super().__init__(num_rows, {"repetition": (torch.float32, 1.0),
                                    "frequency": (torch.float32, 0.0),
                                    "presence": (torch.float32, 0.0)},
                         lambda p: (p.repetition_penalty, p.frequency_penalty,
                                    p.presence_penalty))
        self.num_rows = num_rows
        self.rows: list[Optional[SamplingRow]] = [None] * num_rows
        self.penalized: list[bool] = [False] * num_rows
        self.tables: Optional[PenaltyTables] = None
        """Allocated by the first `tables_for` (a penalized row sampled, or the HPU)."""

    def write_row(self, index: int, row: SamplingRow) -> None:
        super().write_row(index, row)
        self.rows[index] = row
        self.penalized[index] = is_penalized(row.params)
        if self.tables is not None:
            if self.penalized[index]:
                self.tables.write_row(index, row.prompt_token_ids, row.output_token_ids)
            else:
                self.tables.clear_row(index)

    def clear_row(self, index: int) -> None:
        self.rows[index] = None
        self.penalized[index] = False
        if self.tables is not None:
            self.tables.clear_row(index)

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self.rows[dst] = self.rows[src]
        self.penalized[dst] = self.penalized[src]
        if self.penalized[src] and self.tables is not None:
            self.tables.move_row(src, dst)
        self.clear_row(src)

    def record_tokens(self, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        if self.tables is None:
            return
        pairs = [(r, t) for r, t in zip(rows, token_ids) if self.penalized[r]]
        if pairs:
            self.tables.add_tokens(*zip(*pairs))

    def tables_for(self, vocab_size: int, device: torch.device | str) -> PenaltyTables:
        """The tables, allocated (and every penalized row written) on first use."""
        tables = self.tables
        if (tables is None or tables.vocab_size != vocab_size
                or tables.device != torch.device(device)):
            tables = PenaltyTables(self.num_rows, vocab_size, device)
            for i, row in enumerate(self.rows):
                if self.penalized[i]:
                    tables.write_row(i, row.prompt_token_ids, row.output_token_ids)
            self.tables = tables
        return tables


class PenaltiesProcessor(BuiltinLogitsProcessor):
    name = "penalties"

    def activates(self, params: SamplingParams) -> bool:
        return is_penalized(params)

    def holds_drafts_back(self, params: SamplingParams, num_output_tokens: int) -> bool:
        return is_penalized(params)

    def new_state(self, num_rows: int) -> PenaltyState:
        return PenaltyState(num_rows)

    def build(self, ctx: BuildContext) -> Optional[PenaltyInputs]:
        state: PenaltyState = ctx.states[self.name]
        rows, device = ctx.rows, ctx.device
        local = [i for i, r in enumerate(rows) if state.penalized[r]]
        if not local:
            return None
        tables = state.tables_for(ctx.vocab_size, device)
        table_rows = torch.tensor([rows[i] for i in local], dtype=torch.int64)
        knobs = torch.stack([state.gather(name, table_rows)
                             for name in ("repetition", "frequency", "presence")])
        repetition, frequency, presence = host_to_device(knobs, torch.float32, device)
        return PenaltyInputs(
            rows=host_to_device(local, torch.int64, device),
            table_rows=host_to_device(table_rows, torch.int64, device),
            token_stats=tables.token_stats, seen_tokens=[tables.seen[rows[i]] for i in local],
            repetition=repetition, frequency=frequency, presence=presence)

    def apply(self, logits: torch.Tensor, inputs: PenaltyInputs,
              static_shapes: bool) -> torch.Tensor:
        penalize = apply_penalties_dense if static_shapes else apply_penalties
        return penalize(logits, inputs)

    def fixed_form(self, inputs: Optional[PenaltyInputs], md: SamplingMetadata,
                   dense: DenseForms, state: Optional[PenaltyState] = None
                   ) -> Optional[PenaltyInputs]:
        """Every row, neutral values (repetition 1, frequency and presence 0) on rows
        without penalties; a batch without any reads `state`'s count table (the one
        penalized rows use, so both have one shape), or has none without `state`."""
        n = md.num_rows
        if inputs is not None:
            return _every_row(inputs, n)
        if state is None:
            return None
        token_stats = state.tables_for(md.vocab_size, dense.ban.device).token_stats
        device = token_stats.device
        return PenaltyInputs(rows=torch.arange(n, device=device),
                             table_rows=torch.zeros(n, dtype=torch.int64, device=device),
                             token_stats=token_stats, seen_tokens=[],
                             repetition=torch.ones(n, dtype=torch.float32, device=device),
                             frequency=torch.zeros(n, dtype=torch.float32, device=device),
                             presence=torch.zeros(n, dtype=torch.float32, device=device))


def _every_row(p: PenaltyInputs, num_rows: int) -> PenaltyInputs:
    """Penalties on all `num_rows` rows for the whole-row path: neutral values on rows
    without penalties; no per-row seen-token lists (not a fixed shape, not needed)."""
    def spread(values: torch.Tensor, neutral: float) -> torch.Tensor:
        return values.new_full((num_rows,), neutral).index_copy_(0, p.rows, values)

    return PenaltyInputs(rows=torch.arange(num_rows, device=p.rows.device),
                         table_rows=spread(p.table_rows, 0),
                         token_stats=p.token_stats, seen_tokens=[],
                         repetition=spread(p.repetition, 1.0),
                         frequency=spread(p.frequency, 0.0),
                         presence=spread(p.presence, 0.0))
