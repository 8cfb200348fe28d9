"""Custom logits processors written as a vLLM user writes them (imports from vLLM's own
path only), loaded by the tests by class and by qualified name."""
from __future__ import annotations

from typing import Optional

import torch

from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class BanTokenLogitsProcessor(LogitsProcessor):
    """Bans the token `extra_args["banned_token_id"]` for requests that ask for it."""

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        token = (params.extra_args or {}).get("banned_token_id")
        if token is not None and not isinstance(token, int):
            raise ValueError(f"banned_token_id must be an int, got {token!r}")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.banned: dict[int, int] = {}
        self.updates: list[BatchUpdate] = []

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is None:
            return
        self.updates.append(batch_update)
        for index in batch_update.removed:
            self.banned.pop(index, None)
        for index, params, _, _ in batch_update.added:
            token = (params.extra_args or {}).get("banned_token_id")
            if token is None:
                self.banned.pop(index, None)
            else:
                self.banned[index] = token
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self.banned.pop(a, None), self.banned.pop(b, None)
            if moved_a is not None:
                self.banned[b] = moved_a
            if direction == MoveDirectionality.SWAP and moved_b is not None:
                self.banned[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.banned:
            return logits
        rows = torch.tensor(list(self.banned), dtype=torch.long, device=logits.device)
        cols = torch.tensor(list(self.banned.values()), dtype=torch.long,
                            device=logits.device)
        logits[rows, cols] = float("-inf")
        return logits


class ExplodingLogitsProcessor(LogitsProcessor):
    """Raises in `apply` while some request of the batch asks for it (extra_args
    {"explode": True})."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.armed: set[int] = set()

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.armed.discard(index)
        for index, params, _, _ in batch_update.added:
            if (params.extra_args or {}).get("explode"):
                self.armed.add(index)
            else:
                self.armed.discard(index)
        for a, b, _ in batch_update.moved:
            if a in self.armed:
                self.armed.discard(a)
                self.armed.add(b)
            else:
                self.armed.discard(b)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.armed:
            raise RuntimeError("boom")
        return logits
