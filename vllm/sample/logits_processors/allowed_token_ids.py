"""allowed_token_ids: every other token of the row is forbidden."""
from __future__ import annotations

from typing import Optional

import torch

from vllm.sample.host_copy import flat_tokens, host_to_device
from vllm.sample.logits_processors.base import BuildContext, BuiltinLogitsProcessor
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import SamplingMetadata
from vllm.sample.ops.logit_masks import apply_allowed_token_mask
from vllm.sampling_params import SamplingParams


class AllowedTokenIdsProcessor(BuiltinLogitsProcessor):
    name = "allowed_token_ids"

    def activates(self, params: SamplingParams) -> bool:
        return params.allowed_token_ids is not None

    def build(self, ctx: BuildContext) -> Optional[torch.Tensor]:
        """[N, V] bool, True where the token is not allowed (rows without the knob: all
        False)."""
        params, vocab, device = ctx.params, ctx.vocab_size, ctx.device
        users = [i for i, p in enumerate(params) if self.activates(p)]
        if not users:
            return None
        mask = torch.zeros(len(params), vocab, dtype=torch.bool, device=device)
        mask[users] = True
        allowed = [[t for t in params[i].allowed_token_ids if t < vocab] for i in users]
        row_ids, tokens = flat_tokens(allowed, vocab, device)
        mask[host_to_device(users, torch.int64, device)[row_ids], tokens] = False
        return mask

    def apply(self, logits: torch.Tensor, inputs: torch.Tensor,
              static_shapes: bool) -> torch.Tensor:
        return apply_allowed_token_mask(logits, inputs)

    def fixed_form(self, inputs: Optional[torch.Tensor], md: SamplingMetadata,
                   dense: DenseForms, state: object = None) -> None:
        if inputs is not None:
            dense.ban |= inputs
