"""top-k and top-p (nucleus), one knob: top-p is measured after the top-k cut."""
from __future__ import annotations

from typing import Any

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.base import (BuildContext, BuiltinLogitsProcessor,
                                                ColumnState)
from vllm.sample.metadata import SamplingMetadata
from vllm.sample.ops.topk_topp import apply_top_k_top_p, apply_top_k_top_p_sorted
from vllm.sampling_params import SamplingParams


class TopKTopPProcessor(BuiltinLogitsProcessor):
    name = "top_k_top_p"
    stage = "probs"

    def activates(self, params: SamplingParams) -> bool:
        return params.top_k > 0 or params.top_p < 1.0

    def new_state(self, num_rows: int) -> ColumnState:
        return ColumnState(num_rows, {"top_k": (torch.int64, 0), "top_p": (torch.float32, 1.0)},
                           lambda p: (p.top_k, p.top_p))

    def build(self, ctx: BuildContext) -> None:
        md, state, random_params = ctx.md, ctx.states[self.name], ctx.random_params()
        if any(p.top_k > 0 for p in random_params):
            md.top_k = host_to_device(state.gather("top_k", ctx.index), torch.int64,
                                      ctx.device)
            cuts = [p.top_k for p in ctx.params if 0 < p.top_k < md.vocab_size]
            md.top_k_max = max(cuts, default=0)
            md.top_k_any_off = len(cuts) < len(ctx.srows)
        if any(p.top_p < 1.0 for p in random_params):
            md.top_p = host_to_device(state.gather("top_p", ctx.index), torch.float32,
                                      ctx.device)

    def apply_probs(self, logits: torch.Tensor, md: SamplingMetadata,
                    sampler: Any) -> torch.Tensor:
        if sampler.static_shapes and md.top_k is not None and md.top_p is not None:
            return apply_top_k_top_p_sorted(logits, md.top_k, md.top_p)
        if md.top_k is None and md.top_p is None:
            return logits
        return apply_top_k_top_p(logits, md.top_k, md.top_p, md.top_k_max, md.top_k_any_off,
                                 sampler.avoids_host_syncs(logits))

    def fixed_form(self, inputs: None, md: SamplingMetadata, dense: Any,
                   state: object = None) -> None:
        n, device = md.num_rows, dense.ban.device
        if md.top_k is None:
            md.top_k = torch.zeros(n, dtype=torch.int64, device=device)
        if md.top_p is None:
            md.top_p = torch.ones(n, dtype=torch.float32, device=device)
