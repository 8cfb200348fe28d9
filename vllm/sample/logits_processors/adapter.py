"""`AdapterLogitsProcessor`: vLLM's wrapper that runs a per-request logits processor
(a callable on one row: `(output_ids, logits)` or `(prompt_ids, output_ids, logits)`)
as a batch-level one."""
from __future__ import annotations

import inspect
from abc import abstractmethod
from functools import partial
from typing import Any, Callable, Optional

import torch

from vllm.sample.logits_processors.interface import (BatchUpdate, LogitsProcessor,
                                                     MoveDirectionality)
from vllm.sampling_params import SamplingParams

RequestLogitsProcessor = Callable[..., torch.Tensor]


class AdapterLogitsProcessor(LogitsProcessor):
    """Subclass it, implement `is_argmax_invariant` and `new_req_logits_processor`
    (None: the request does not use it); `__init__` must call `super().__init__()`."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.req_info: dict[int, partial] = {}
        """Batch row -> its request's processor, token lists bound (live references)."""

    @abstractmethod
    def new_req_logits_processor(self, params: SamplingParams
                                 ) -> Optional[RequestLogitsProcessor]:
        raise NotImplementedError

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.req_info.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            processor = self.new_req_logits_processor(params)
            if processor is None:
                self.req_info.pop(index, None)
                continue
            takes_prompt = len(inspect.signature(processor).parameters) == 3
            args = (prompt_ids, output_ids) if takes_prompt else (output_ids,)
            self.req_info[index] = partial(processor, *args)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self.req_info.pop(a, None), self.req_info.pop(b, None)
            if moved_a is not None:
                self.req_info[b] = moved_a
            if direction is MoveDirectionality.SWAP and moved_b is not None:
                self.req_info[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, processor in self.req_info.items():
            row = logits[index]
            new = processor(row)
            if new is not row:
                logits[index] = new
        return logits
