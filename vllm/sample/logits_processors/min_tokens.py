"""min_tokens: a row's stop tokens are forbidden until it has min_tokens outputs."""
from __future__ import annotations

from typing import Optional

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.base import BuildContext, BuiltinLogitsProcessor
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import SamplingMetadata, SamplingRow
from vllm.sample.ops.logit_masks import apply_min_tokens
from vllm.sampling_params import SamplingParams

MinTokensInputs = tuple[torch.Tensor, torch.Tensor]
"""(logits rows, stop token ids) to forbid."""


class MinTokensProcessor(BuiltinLogitsProcessor):
    name = "min_tokens"
    expires = True

    def activates(self, params: SamplingParams) -> bool:
        return bool(params.min_tokens)

    def in_force(self, row: SamplingRow) -> bool:
        return self.activates(row.params) and len(row.output_token_ids) < row.params.min_tokens

    def argmax_from(self, params: SamplingParams) -> Optional[int]:
        return params.min_tokens

    def holds_drafts_back(self, params: SamplingParams, num_output_tokens: int) -> bool:
        return num_output_tokens < params.min_tokens

    def build(self, ctx: BuildContext) -> Optional[MinTokensInputs]:
        row_ids: list[int] = []
        token_ids: list[int] = []
        for i, r in enumerate(ctx.srows):
            if self.in_force(r):
                stops = [t for t in r.params.all_stop_token_ids if t < ctx.vocab_size]
                row_ids.extend([i] * len(stops))
                token_ids.extend(stops)
        if not row_ids:
            return None
        return (host_to_device(row_ids, torch.int64, ctx.device),
                host_to_device(token_ids, torch.int64, ctx.device))

    def apply(self, logits: torch.Tensor, inputs: MinTokensInputs,
              static_shapes: bool) -> torch.Tensor:
        return apply_min_tokens(logits, *inputs)

    def fixed_form(self, inputs: Optional[MinTokensInputs], md: SamplingMetadata,
                   dense: DenseForms, state: object = None) -> None:
        if inputs is not None:
            rows, tokens = inputs
            dense.ban[rows, tokens] = True
