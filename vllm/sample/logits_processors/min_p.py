"""min-p: drop tokens less likely than min_p times the row's most likely one."""
from __future__ import annotations

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.base import (BuildContext, BuiltinLogitsProcessor,
                                                ColumnState)
from vllm.sample.metadata import SamplingMetadata
from vllm.sample.ops.topk_topp import apply_min_p
from vllm.sampling_params import SamplingParams


class MinPProcessor(BuiltinLogitsProcessor):
    name = "min_p"
    stage = "probs"

    def activates(self, params: SamplingParams) -> bool:
        return params.min_p > 0.0

    def new_state(self, num_rows: int) -> ColumnState:
        return ColumnState(num_rows, {"min_p": (torch.float32, 0.0)}, lambda p: (p.min_p,))

    def build(self, ctx: BuildContext) -> None:
        if any(self.activates(p) for p in ctx.random_params()):
            ctx.md.min_p = host_to_device(ctx.states[self.name].gather("min_p", ctx.index),
                                          torch.float32, ctx.device)

    def apply_probs(self, logits: torch.Tensor, md: SamplingMetadata,
                    sampler: object) -> torch.Tensor:
        return logits if md.min_p is None else apply_min_p(logits, md.min_p)

    def fixed_form(self, inputs: None, md: SamplingMetadata, dense: object,
                   state: object = None) -> None:
        if md.min_p is None:
            md.min_p = torch.zeros(md.num_rows, dtype=torch.float32, device=dense.ban.device)
