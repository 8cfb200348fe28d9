"""A logits processor written as a vLLM user writes one: it makes a request generate
exactly the token ids in `extra_args["script"]` (teacher forcing), so a tiny random
model can "speak" harmony in the served round-trip tests."""
from __future__ import annotations

from typing import Optional

import torch

from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class ScriptedOutputLogitsProcessor(LogitsProcessor):

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        script = (params.extra_args or {}).get("script")
        if script is not None and not (isinstance(script, list)
                                       and all(isinstance(t, int) for t in script)):
            raise ValueError("script must be a list of token ids")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}
        """batch row -> (script, the request's live output ids)."""

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _, output_ids in batch_update.added:
            script = (params.extra_args or {}).get("script")
            if script:
                self.rows[index] = (script, output_ids)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (script, output_ids) in self.rows.items():
            step = min(len(output_ids), len(script) - 1)
            logits[row] = float("-inf")
            logits[row, script[step]] = 0.0
        return logits
