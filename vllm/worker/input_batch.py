"""The persistent input batch: one row per request scheduled in the current step.

A request keeps its row from step to step while it stays scheduled, so what does
not change between steps is built once per request instead of once per step: the
sampler's view of the request (`SamplingRow`, whose token lists are the request
state's own lists and so stay current) and whether the request can take the argmax
fast path. A request that is not scheduled in a step (preempted, or left out by
the token budget) loses its row but not its state (`CachedRequestState`); it gets a
row again when it is scheduled again. Freed rows are refilled by moving the last
rows into them (`condense`), so rows are always 0..num_reqs-1.
"""
from __future__ import annotations

from typing import Iterable, Optional

from vllm.sample.metadata import SamplingRow, needs_only_argmax
from vllm.worker.request_state import CachedRequestState


class InputBatch:

    def __init__(self, max_num_reqs: int) -> None:
        self.max_num_reqs = max_num_reqs
        self._req_ids: list[Optional[str]] = []
        self.req_id_to_index: dict[str, int] = {}
        self._sampling_rows: list[Optional[SamplingRow]] = []
        self._argmax_min_outputs: list[Optional[int]] = []
        """Per row: output count from which the argmax of the raw logits is the row's
        token (its min_tokens), or None when the row always needs the sampler."""
        self._states: list[Optional[CachedRequestState]] = []
        self._holes: list[int] = []

    # ----------------------------------------------------------------- rows
    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    @property
    def req_ids(self) -> list[str]:
        """Request ids in row order (call after `condense`, when there are no holes)."""
        return [r for r in self._req_ids if r is not None]

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.req_id_to_index

    def add_request(self, state: CachedRequestState) -> int:
        """Give the request a row (a freed one first); returns the row."""
        if state.req_id in self.req_id_to_index:
            self.remove_request(state.req_id)
        if self._holes:
            row = self._holes.pop()
        elif len(self._req_ids) < self.max_num_reqs:
            row = len(self._req_ids)
            for column in (self._req_ids, self._sampling_rows, self._argmax_min_outputs,
                           self._states):
                column.append(None)
        else:
            raise ValueError(f"The input batch is full ({self.max_num_reqs} requests, "
                             f"max_num_seqs); cannot add request {state.req_id!r}.")
        params = state.sampling_params
        self._req_ids[row] = state.req_id
        self._states[row] = state
        self._sampling_rows[row] = SamplingRow(
            params=params, prompt_token_ids=state.prompt_token_ids,
            output_token_ids=state.output_token_ids, generator=state.generator)
        self._argmax_min_outputs[row] = (params.min_tokens
                                         if needs_only_argmax(params, params.min_tokens)
                                         else None)
        self.req_id_to_index[state.req_id] = row
        return row

    def remove_request(self, req_id: str) -> Optional[int]:
        """Free the request's row (the state itself is the caller's); None if absent."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self._req_ids[row] = None
        self._states[row] = None
        self._sampling_rows[row] = None
        self._argmax_min_outputs[row] = None
        self._holes.append(row)
        return row

    def retain_only(self, req_ids: Iterable[str] | dict) -> None:
        """Free the rows of every request not in `req_ids` (those not scheduled)."""
        keep = req_ids if isinstance(req_ids, (dict, set)) else set(req_ids)
        for req_id in [r for r in self.req_id_to_index if r not in keep]:
            self.remove_request(req_id)

    def condense(self) -> None:
        """Move the last rows into the holes so that rows are 0..num_reqs-1 again."""
        if not self._holes:
            return
        columns = (self._req_ids, self._sampling_rows, self._argmax_min_outputs, self._states)
        for hole in sorted(self._holes):
            while self._req_ids and self._req_ids[-1] is None:
                for column in columns:
                    column.pop()
            if hole >= len(self._req_ids):
                break
            last = len(self._req_ids) - 1
            for column in columns:
                column[hole] = column[last]
                column.pop()
            self.req_id_to_index[self._req_ids[hole]] = hole
        while self._req_ids and self._req_ids[-1] is None:
            for column in columns:
                column.pop()
        self._holes.clear()

    # -------------------------------------------------------------- sampling
    def sampling_row(self, req_id: str) -> SamplingRow:
        return self._sampling_rows[self.req_id_to_index[req_id]]

    def takes_argmax(self, req_id: str) -> bool:
        """Whether the request's next token is the argmax of the raw logits (see
        `needs_only_argmax`): greedy, no logprobs, nothing editing the logits."""
        row = self.req_id_to_index[req_id]
        min_outputs = self._argmax_min_outputs[row]
        return (min_outputs is not None
                and len(self._states[row].output_token_ids) >= min_outputs)
