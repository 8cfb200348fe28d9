"""Small value types shared by the engine, the models and the frontends."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Logprob:
    """One token's log probability, its rank in the vocabulary and its text."""
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# One dict per generated token: token id -> Logprob (top-N plus the chosen token).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token; the first is None (nothing predicts it).
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class IntermediateTensors:
    """Hidden states passed between pipeline stages (name -> tensor)."""
    tensors: dict[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.tensors[key] = value

    def items(self):
        return self.tensors.items()
