"""The runner's side of custom logits processors (vLLM's API, interface.py).

`CustomLogitsProcessors` holds the engine's processor instances and a
`BatchUpdateBuilder` the input batch reports its row changes to. Each step, after the
batch is settled, `update_state` hands every processor the changes; on each pass's
sampling logits (before the built-in knobs), `apply` runs them.

Processors index their state by batch row, and vLLM gives them logits whose row i is
batch row i. A pass's sampling logits are laid out otherwise (several passes per
step; HPU buckets with padding rows), so `apply` lays them out by batch row first,
unless they already are (the common decode step): the flat form gathers exactly
`batch_size` rows; the static form (`static_width`, HPU) always `static_width` rows
(the batch's capacity), so its shapes depend only on the bucket. Rows of batch
requests that are not in the pass hold a copy of one of its rows, and what the
processors write there is discarded. Processors see the logits in the model's dtype.

A processor that raises fails requests, never the engine: in `apply`, the requests
of the pass it could act on (those whose params carry `extra_args`, the only way to
address a processor per request; all of the pass's requests when none does); in
`update_state`, the requests it was being told about (the added ones, or every
request of the batch when none was added). The caller ends them with finish reason
"error"; the other rows keep the logits as the processor left them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.interface import LogitsProcessor
from vllm.sample.logits_processors.state import BatchUpdateBuilder
from vllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class ProcessorFailure:
    """A processor raised: the batch rows it is blamed for, and why."""
    rows: list[int]
    message: str


class CustomLogitsProcessors:

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.processors = list(processors)
        self.builder = BatchUpdateBuilder()
        self.argmax_invariant = all(p.is_argmax_invariant() for p in self.processors)
        self._params: dict[int, SamplingParams] = {}
        """Batch row -> its request's params (who to blame)."""

    @classmethod
    def build(cls, vllm_config: Any, device: torch.device,
              classes: Sequence[type[LogitsProcessor]]) -> Optional["CustomLogitsProcessors"]:
        if not classes:
            return None
        pin = device.type == "cuda"
        return cls([c(vllm_config, device, pin) for c in classes])

    # ------------------------------------------------------- batch changes
    def added(self, row: int, params: SamplingParams, prompt_token_ids: list[int],
              output_token_ids: list[int]) -> None:
        self.builder.added_append((row, params, prompt_token_ids, output_token_ids))
        self._params[row] = params

    def removed(self, row: int) -> None:
        self.builder.removed_append(row)
        self._params.pop(row, None)

    def moved(self, src: int, dst: int) -> None:
        self.builder.moved_append(src, dst)
        if src in self._params:
            self._params[dst] = self._params.pop(src)

    def update_state(self, batch_size: int) -> list[ProcessorFailure]:
        """Every processor told about the changes since the last call (None: none)."""
        update = self.builder.get_and_reset(batch_size)
        failures = []
        for processor in self.processors:
            try:
                processor.update_state(update)
            except Exception as e:  # noqa: BLE001 - a user processor fails requests only
                rows = ([a[0] for a in update.added] if update is not None and update.added
                        else list(range(batch_size)))
                failures.append(self._failure(processor, "update_state", e, rows))
        return failures

    # ---------------------------------------------------------------- apply
    def apply(self, logits: torch.Tensor, batch_rows: Sequence[Optional[int]],
              batch_size: int, static_width: Optional[int] = None
              ) -> tuple[torch.Tensor, list[ProcessorFailure]]:
        """Every processor on `logits` (row i: batch row batch_rows[i], None for a row
        that does not sample); returns the logits and the failures."""
        layout = _Layout.of(batch_rows, batch_size, static_width, logits.device)
        view = layout.gather(logits)
        failures = []
        for processor in self.processors:
            try:
                view = processor.apply(view)
            except Exception as e:  # noqa: BLE001 - a user processor fails requests only
                failures.append(self._failure(processor, "apply", e, self._blame(batch_rows)))
        return layout.scatter(view, logits), failures

    def _blame(self, batch_rows: Sequence[Optional[int]]) -> list[int]:
        rows = [r for r in batch_rows if r is not None]
        addressed = [r for r in rows if r in self._params and self._params[r].extra_args]
        return addressed or rows

    @staticmethod
    def _failure(processor: LogitsProcessor, where: str, error: Exception,
                 rows: list[int]) -> ProcessorFailure:
        name = type(processor).__qualname__
        logger.exception("Logits processor %s raised in %s; failing the requests of batch "
                         "rows %s.", name, where, rows)
        return ProcessorFailure(rows, f"logits processor {name} failed in {where}: {error}")


@dataclass
class _Layout:
    """How a pass's logits map to batch-row order (see the module docstring)."""
    identity: bool
    src: Optional[torch.Tensor] = None
    """[width]: the logits row each batch row reads."""
    dst: Optional[torch.Tensor] = None
    """[rows]: the batch row each logits row reads back."""
    keep: Optional[torch.Tensor] = None
    """[rows, 1] bool: logits rows that take the processed values."""

    @classmethod
    def of(cls, batch_rows: Sequence[Optional[int]], batch_size: int,
           static_width: Optional[int], device: torch.device) -> "_Layout":
        if static_width is None and list(batch_rows) == list(range(batch_size)):
            return cls(identity=True)
        width = static_width or batch_size
        src = [0] * width
        for i, row in enumerate(batch_rows):
            if row is not None:
                src[row] = i
        dst = [0 if r is None else r for r in batch_rows]
        keep = [[r is not None] for r in batch_rows]
        return cls(False, host_to_device(src, torch.int64, device),
                   host_to_device(dst, torch.int64, device),
                   host_to_device(keep, torch.bool, device))

    def gather(self, logits: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return logits
        return logits.index_select(0, self.src)

    def scatter(self, view: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return view
        return torch.where(self.keep, view.index_select(0, self.dst), logits)
