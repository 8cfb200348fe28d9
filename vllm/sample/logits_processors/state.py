"""Collecting the persistent batch's changes into a vLLM `BatchUpdate`."""
from __future__ import annotations

from typing import Optional

from vllm.sample.logits_processors.interface import (AddedRequest, BatchUpdate,
                                                     MoveDirectionality, MovedRequest)


class BatchUpdateBuilder:
    """Records removed, added and moved rows as the input batch changes them; `get_and_reset`
    hands them out as one `BatchUpdate` (None when nothing changed)."""

    def __init__(self) -> None:
        self.removed: list[int] = []
        self.added: list[AddedRequest] = []
        self.moved: list[MovedRequest] = []

    def removed_append(self, index: int) -> None:
        self.removed.append(index)

    def added_append(self, added: AddedRequest) -> None:
        self.added.append(added)

    def moved_append(self, src: int, dst: int,
                     direction: MoveDirectionality = MoveDirectionality.UNIDIRECTIONAL) -> None:
        self.moved.append((src, dst, direction))

    def get_and_reset(self, batch_size: int) -> Optional[BatchUpdate]:
        if not (self.removed or self.added or self.moved):
            return None
        update = BatchUpdate(batch_size, tuple(self.removed), tuple(self.added),
                             tuple(self.moved))
        self.removed, self.added, self.moved = [], [], []
        return update
