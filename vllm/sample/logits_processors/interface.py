"""vLLM's custom logits-processor API (`vllm.v1.sample.logits_processor`), as users write
processors for it: a processor is constructed once per engine with
`(vllm_config, device, is_pin_memory)`, told about the persistent batch's changes
before each forward (`update_state`), and applied to the batch's logits, row i
being the request in batch row i (`apply`).

`BatchUpdate` lists the changes since the last call, to be processed in the order
removed, added, moved: an added entry is (index, SamplingParams, prompt token ids,
output token ids), the output list being the request's live running list; a moved
entry is (index 1, index 2, UNIDIRECTIONAL: 1 -> 2, or SWAP: 1 <-> 2). Added or
moved requests may replace requests at the same index.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()
    """The request at index 1 moves to index 2 (index 1 is left empty)."""
    SWAP = auto()
    """The requests at index 1 and index 2 trade places."""


RemovedRequest = int
"""Batch index of a removed request."""
AddedRequest = tuple[int, SamplingParams, Optional[list[int]], list[int]]
"""(index, params, prompt token ids, live output token ids) of an added request."""
MovedRequest = tuple[int, int, MoveDirectionality]
"""(index 1, index 2, directionality)."""


@dataclass(frozen=True)
class BatchUpdate:
    """The persistent batch's changes since the last `update_state` (see the module
    docstring for the order and the tuple shapes)."""
    batch_size: int
    """Requests in the batch after the changes (rows 0 .. batch_size - 1)."""
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """A batch-level logits processor (vLLM's interface; see the module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Check a request's params when it is submitted; raise ValueError for invalid
        ones (the request is refused: a 400 on the server)."""
        return None

    @abstractmethod
    def __init__(self, vllm_config: "VllmConfig", device: torch.device,
                 is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed [batch, vocab] logits (may be modified in place)."""
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if the processor never changes a greedy row's argmax (then greedy-only
        batches may skip it)."""
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        """Called before each forward pass; `batch_update` is None when the batch did
        not change."""
        raise NotImplementedError
