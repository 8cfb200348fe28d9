"""logit_bias: a per-request bias added to chosen tokens' logits."""
from __future__ import annotations

from typing import Optional

import torch

from vllm.sample.host_copy import host_to_device
from vllm.sample.logits_processors.base import BuildContext, BuiltinLogitsProcessor
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import SamplingMetadata
from vllm.sample.ops.logit_masks import apply_logit_bias
from vllm.sampling_params import SamplingParams

LogitBiasInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(logits rows, token ids, bias values)."""


class LogitBiasProcessor(BuiltinLogitsProcessor):
    name = "logit_bias"

    def activates(self, params: SamplingParams) -> bool:
        return bool(params.logit_bias)

    def build(self, ctx: BuildContext) -> Optional[LogitBiasInputs]:
        row_ids: list[int] = []
        token_ids: list[int] = []
        values: list[float] = []
        for i, p in enumerate(ctx.params):
            for token, bias in (p.logit_bias or {}).items():
                if token < ctx.vocab_size:
                    row_ids.append(i)
                    token_ids.append(token)
                    values.append(bias)
        if not row_ids:
            return None
        return (host_to_device(row_ids, torch.int64, ctx.device),
                host_to_device(token_ids, torch.int64, ctx.device),
                host_to_device(values, torch.float32, ctx.device))

    def apply(self, logits: torch.Tensor, inputs: LogitBiasInputs,
              static_shapes: bool) -> torch.Tensor:
        return apply_logit_bias(logits, *inputs)

    def fixed_form(self, inputs: Optional[LogitBiasInputs], md: SamplingMetadata,
                   dense: DenseForms, state: object = None) -> None:
        if inputs is not None:
            rows, tokens, values = inputs
            dense.bias.index_put_((rows, tokens), values.to(torch.float32), accumulate=True)
