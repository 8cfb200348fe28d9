"""The model runner's own copy of each request it serves, kept in step with the scheduler.

The scheduler sends a new request once in full and afterwards only what changed
(new blocks, progress), so every rank of a multiprocess executor can follow along
from small messages. Sampled tokens are appended here by the runner itself.

A state lives from the request's first scheduling until the scheduler reports it
finished; a preempted request keeps its state (and with it the position of its
seeded generator), so resuming it continues the same random stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    wants_prompt_logprobs: bool
    generator: Optional[torch.Generator] = None
    lora_request: Optional[LoRARequest] = None
    mm_inputs: Optional[Any] = None
    token_ids: list[int] = field(default_factory=list)
    num_prompt_logprobs_sent: int = 0
    """Prompt positions whose logprobs were already returned (a request resumed after
    preemption recomputes its prompt without sending them twice)."""

    def __post_init__(self) -> None:
        self.token_ids = self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
