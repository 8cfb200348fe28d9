"""The model runner's own copy of each request it serves, kept in step with the scheduler.

The scheduler sends a new request once in full (`NewRequestData`) and afterwards
only what changed (new blocks, progress), so every rank of a multiprocess executor
can follow along from small messages. The state is that first message's fields (it
extends `NewRequestData`, so they are declared once) plus what the runner tracks;
sampled tokens are appended here by the runner itself.

A state lives from the request's first scheduling until the scheduler reports it
finished; a preempted request keeps its state (and with it the position of its
seeded generator), so resuming it continues the same random stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

import torch

from vllm.core.sched_output import NewRequestData
from vllm.sample.metadata import make_generator

_MUTABLE_LISTS = ("prompt_token_ids", "output_token_ids", "block_ids")
"""List fields the runner changes or keeps: copied, not shared with the message."""


@dataclass
class CachedRequestState(NewRequestData):
    generator: Optional[torch.Generator] = None
    """The seeded request's own generator (None without a seed)."""
    token_ids: list[int] = field(default_factory=list)
    num_prompt_logprobs_sent: int = 0
    """Prompt positions whose logprobs were already returned (a request resumed after
    preemption recomputes its prompt without sending them twice)."""
    mrope_positions: Optional[torch.Tensor] = None
    """[3, prompt tokens] M-RoPE positions of a request with images, computed on its
    first pass (vllm/multimodal/mrope.py); None otherwise."""
    mrope_position_delta: int = 0
    """What a token past the prompt adds to its index on all three M-RoPE rows."""

    def __post_init__(self) -> None:
        self.token_ids = self.prompt_token_ids + self.output_token_ids

    @classmethod
    def from_new_request(cls, new: NewRequestData,
                         device: torch.device | str) -> "CachedRequestState":
        """The runner's state of a request first sent as `new` (lists copied, so the
        scheduler's message is never changed; a generator on `device` when seeded)."""
        values = {f.name: getattr(new, f.name) for f in fields(NewRequestData)}
        for name in _MUTABLE_LISTS:
            values[name] = list(values[name])
        values["group_block_ids"] = [list(t) for t in new.group_block_ids]
        seed = new.sampling_params.seed
        return cls(**values, generator=None if seed is None else make_generator(seed, device))

    def group_table(self, group: int) -> list[int]:
        """The block table of KV cache group `group` (0: `block_ids`)."""
        return self.block_ids if group == 0 else self.group_block_ids[group - 1]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
