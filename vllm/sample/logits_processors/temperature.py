"""Temperature: random rows' logits divided by their temperature (greedy rows: 1.0)."""
from __future__ import annotations

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.base import (BuildContext, BuiltinLogitsProcessor,
                                                ColumnState)
from vllm.sample.metadata import SamplingMetadata, is_greedy
from vllm.sampling_params import SamplingParams


class TemperatureProcessor(BuiltinLogitsProcessor):
    name = "temperature"
    stage = "probs"

    def activates(self, params: SamplingParams) -> bool:
        return not is_greedy(params)

    def new_state(self, num_rows: int) -> ColumnState:
        return ColumnState(num_rows, {"temperature": (torch.float32, 1.0)},
                           lambda p: (1.0 if is_greedy(p) else p.temperature,))

    def build(self, ctx: BuildContext) -> None:
        md = ctx.md
        md.temperature = host_to_device(ctx.states[self.name].gather("temperature", ctx.index),
                                        torch.float32, ctx.device)
        if not md.all_random:
            md.greedy_mask = host_to_device(ctx.greedy, torch.bool, ctx.device)

    def apply_probs(self, logits: torch.Tensor, md: SamplingMetadata,
                    sampler: object) -> torch.Tensor:
        return logits.div_(md.temperature.unsqueeze(1))

    def fixed_form(self, inputs: None, md: SamplingMetadata, dense: object,
                   state: object = None) -> None:
        n, device = md.num_rows, dense.ban.device
        if md.temperature is None:
            md.temperature = torch.ones(n, dtype=torch.float32, device=device)
        if md.greedy_mask is None:
            md.greedy_mask = torch.full((n,), md.all_greedy, dtype=torch.bool, device=device)
