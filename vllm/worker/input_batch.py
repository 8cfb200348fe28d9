"""The persistent input batch: one row per request scheduled in the current step.

A request keeps its row from step to step while it stays scheduled, so what does
not change between steps is written once per request instead of once per step: its
sampling knobs and penalty token tables in the rows of preallocated tensors
(`SamplingState`: max_num_seqs rows, plus one neutral row that fixed-shape padding
reads), and whether it can take the argmax fast path.
A request that is not scheduled in a step (preempted, or left out by the token
budget) loses its row but not its state (`CachedRequestState`); it gets a row again
when it is scheduled again. Freed rows are refilled by moving the last rows into
them (`condense`), so rows are always 0..num_reqs-1.

The sampler's metadata is cached (`sampling_metadata`): a step whose requests and
logits layout are those of the previous step reuses it. Its only per-step input,
the output token counts of the penalties, lives in tensors the metadata refers to
and that `record_output_tokens` updates in place; a knob whose effect ends with the
output length (min_tokens: `expires` in the table of logits processors) expires the
cache when a row reaches it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Optional, Sequence

import torch

from vllm.sample.logits_processors import BUILTIN_PROCESSORS, argmax_from
from vllm.sample.logits_processors.base import BuiltinLogitsProcessor
from vllm.sample.logits_processors.custom import CustomLogitsProcessors
from vllm.sample.metadata import PADDING_ROW, SamplingMetadata, SamplingRow
from vllm.sample.sampling_state import SamplingState
from vllm.worker.request_state import CachedRequestState

_MAX_CACHED_LAYOUTS = 8
"""Logits layouts cached at once (a step has one per pass; a layout that changes
without the batch changing, e.g. a reordering, would otherwise pile up)."""

MetadataFinalizer = Callable[[SamplingMetadata, torch.device], SamplingMetadata]
"""(metadata, device) -> the metadata to cache, e.g. the HPU's fixed shapes."""


@dataclass
class _CachedSampling:
    metadata: Optional[SamplingMetadata]
    """None: every row takes the argmax of its raw logits."""
    in_force: list[tuple[SamplingRow, BuiltinLogitsProcessor]]
    """(row, knob) pairs of expiring knobs (min_tokens) in force at build time: the
    entry expires once one of them no longer is (its stop tokens are allowed again,
    maybe the argmax path)."""
    per_step: bool = False
    """A knob's fixed-shape form depends on the latest output (a bad word of several
    tokens, folded into the HPU's mask): the entry serves one step."""

    def expired(self) -> bool:
        return self.per_step or any(not p.in_force(r) for r, p in self.in_force)


class InputBatch:

    def __init__(self, max_num_reqs: int,
                 custom: Optional[CustomLogitsProcessors] = None) -> None:
        self.max_num_reqs = max_num_reqs
        self.custom = custom
        """Custom logits processors, told every row change (vLLM's BatchUpdate)."""
        self.custom_breaks_argmax = custom is not None and not custom.argmax_invariant
        """A custom processor may change the argmax: no row takes the raw argmax without
        the sampler (as in vLLM)."""
        self.padding_row = max_num_reqs
        """A row past the requests' holding `PADDING_ROW`: what logits rows that sample
        nothing (fixed-shape padding) read."""
        self.sampling = SamplingState(max_num_reqs + 1)
        self.sampling.write_row(self.padding_row, PADDING_ROW)
        self._req_ids: list[Optional[str]] = []
        self.req_id_to_index: dict[str, int] = {}
        self._argmax_min_outputs: list[Optional[int]] = []
        """Per row: output count from which the argmax of the raw logits is the row's
        token (its min_tokens), or None when the row always needs the sampler."""
        self._states: list[Optional[CachedRequestState]] = []
        self._holes: list[int] = []
        self.version = 0
        """Bumped whenever a row changes request (add, remove, move)."""
        self._cache: dict[Hashable, _CachedSampling] = {}
        """Metadata by logits layout (one per pass of a step), for `_cache_version`."""
        self._cache_version = 0
        self.num_metadata_builds = 0

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
        """Give the request a row (a freed one first) and write it; returns the row."""
        if state.req_id in self.req_id_to_index:
            self.remove_request(state.req_id)
        if self._holes:
            row = self._holes.pop()
        elif len(self._req_ids) < self.max_num_reqs:
            row = len(self._req_ids)
            for column in (self._req_ids, self._argmax_min_outputs, self._states):
                column.append(None)
        else:
            raise ValueError(f"The input batch is full ({self.max_num_reqs} requests, "
                             f"max_num_seqs); cannot add request {state.req_id!r}.")
        params = state.sampling_params
        self._req_ids[row] = state.req_id
        self._states[row] = state
        self.sampling.write_row(row, SamplingRow(
            params=params, prompt_token_ids=state.prompt_token_ids,
            output_token_ids=state.output_token_ids, generator=state.generator))
        self._argmax_min_outputs[row] = (None if self.custom_breaks_argmax
                                         else argmax_from(params))
        self.req_id_to_index[state.req_id] = row
        if self.custom is not None:
            self.custom.added(row, params, state.prompt_token_ids, state.output_token_ids)
        self.version += 1
        return row

    def remove_request(self, req_id: str) -> Optional[int]:
        """Free the request's row (the state itself is the caller's); None if absent."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self._req_ids[row] = None
        self._states[row] = None
        self.sampling.clear_row(row)
        self._argmax_min_outputs[row] = None
        self._holes.append(row)
        if self.custom is not None:
            self.custom.removed(row)
        self.version += 1
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
        for hole in sorted(self._holes):
            self._drop_trailing_free_rows()
            if hole >= len(self._req_ids):
                break
            self._move_row(len(self._req_ids) - 1, hole)
        self._drop_trailing_free_rows()
        self._holes.clear()
        self.version += 1

    def _move_row(self, src: int, dst: int) -> None:
        """The last row `src` into the free row `dst` (host lists and tensor rows)."""
        for column in (self._req_ids, self._argmax_min_outputs, self._states):
            column[dst] = column.pop()
        self.sampling.move_row(src, dst)
        self.req_id_to_index[self._req_ids[dst]] = dst
        if self.custom is not None:
            self.custom.moved(src, dst)

    def _drop_trailing_free_rows(self) -> None:
        while self._req_ids and self._req_ids[-1] is None:
            for column in (self._req_ids, self._argmax_min_outputs, self._states):
                column.pop()

    # -------------------------------------------------------------- sampling
    def sampling_row(self, req_id: str) -> SamplingRow:
        return self.sampling.rows[self.req_id_to_index[req_id]]

    def takes_argmax(self, req_id: str) -> bool:
        """Whether the request's next token is the argmax of the raw logits (see
        `needs_only_argmax`): greedy, no logprobs, nothing editing the logits."""
        row = self.req_id_to_index[req_id]
        min_outputs = self._argmax_min_outputs[row]
        return (min_outputs is not None
                and len(self._states[row].output_token_ids) >= min_outputs)

    def sampling_metadata(self, req_ids: Sequence[Optional[str]], vocab_size: int,
                          device: torch.device | str,
                          finalize: Optional[MetadataFinalizer] = None
                          ) -> Optional[SamplingMetadata]:
        """The sampler's metadata for logits whose row i samples for request req_ids[i]
        (None: a row that samples nothing, read as `PADDING_ROW`); None when every
        request takes the argmax of its raw logits (see `takes_argmax`).

        `finalize` (e.g. the HPU's fixed shapes) is applied once per build. Cached:
        rebuilt only when the batch's rows, `req_ids`, the vocabulary, the device or
        `finalize` change, or when a row reaches its min_tokens.
        """
        if self._cache_version != self.version:
            self._cache.clear()
            self._cache_version = self.version
        key = (tuple(req_ids), vocab_size, torch.device(device), finalize)
        cached = self._cache.get(key)
        if cached is None or cached.expired():
            if len(self._cache) >= _MAX_CACHED_LAYOUTS:
                self._cache.clear()
            cached = self._cache[key] = self._build_sampling(req_ids, vocab_size, device,
                                                             finalize)
        return cached.metadata

    def _build_sampling(self, req_ids: Sequence[Optional[str]], vocab_size: int,
                        device: torch.device | str,
                        finalize: Optional[MetadataFinalizer]) -> _CachedSampling:
        self.num_metadata_builds += 1
        rows = [self.padding_row if r is None else self.req_id_to_index[r] for r in req_ids]
        in_force = [(self.sampling.rows[i], p) for i in rows for p in BUILTIN_PROCESSORS
                    if p.expires and p.in_force(self.sampling.rows[i])]
        metadata = None
        per_step = False
        if not all(self.takes_argmax(r) for r in req_ids if r is not None):
            metadata = self.sampling.metadata(rows, vocab_size, device)
            per_step = finalize is not None and any(
                p.per_step(metadata.logits_inputs.get(p.name)) for p in BUILTIN_PROCESSORS)
            if finalize is not None:
                metadata = finalize(metadata, torch.device(device))
        return _CachedSampling(metadata, in_force, per_step)

    def record_output_tokens(self, req_ids: Sequence[str], token_ids: Sequence[int]) -> None:
        """token_ids[i] was just appended to request req_ids[i]'s output: count it for
        the penalties (the cached metadata reads the counts in place)."""
        index = self.req_id_to_index
        self.sampling.record_tokens([index[r] for r in req_ids], token_ids)
