"""The model runner's own copy of each running request, kept in step with the scheduler.

The scheduler sends a new request once in full and afterwards only what changed
(new blocks, progress), so every rank of a multiprocess executor can follow along
from small messages. Sampled tokens are appended here by the runner itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from vllm.core.sched_output import SchedulerOutput
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
    token_ids: list[int] = field(default_factory=list)
    lora_request: Optional[LoRARequest] = None

    def __post_init__(self) -> None:
        self.token_ids = self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)


def make_generator(params: SamplingParams, device: torch.device | str,
                   num_output_tokens: int) -> Optional[torch.Generator]:
    """A per-request generator for seeded sampling, so batch mates never change it."""
    if params.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


class RequestStates(dict):
    """req_id -> CachedRequestState, updated from each SchedulerOutput."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = device

    def update(self, so: SchedulerOutput) -> None:  # type: ignore[override]
        for req_id in so.finished_req_ids:
            self.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            self[new.req_id] = CachedRequestState(
                req_id=new.req_id, prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                sampling_params=new.sampling_params, block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                wants_prompt_logprobs=new.wants_prompt_logprobs,
                generator=make_generator(new.sampling_params, self.device,
                                         len(new.output_token_ids)),
                lora_request=new.lora_request)
        for cached in so.scheduled_cached_reqs:
            state = self[cached.req_id]
            state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
            missing = cached.num_tokens - state.num_tokens
            if missing > 0:  # this rank did not sample them itself
                for token_id in cached.new_token_ids[-missing:]:
                    state.append_token(token_id)
