"""The fixed-shape form the masking and biasing knobs share on the HPU.

Knobs that forbid tokens (allowed_token_ids, bad_words, min_tokens) fold into one
[N, V] bool mask, and knobs that add to the logits (logit_bias) into one [N, V]
float32 add: both are always present in fixed-shape metadata (all False / zeros when
no row asks), so a bucket's sampler has one shape whatever the requests ask for.
Folding is exact: every forbidding knob sets -inf before any bias or penalty, and
-inf stays -inf through both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DENSE = "dense"
"""Key of `DenseForms` in `SamplingMetadata.logits_inputs` (applied before the knobs
that keep their own fixed form)."""


@dataclass
class DenseForms:
    ban: torch.Tensor  # [N, V] bool: True = -inf
    bias: torch.Tensor  # [N, V] float32, added after the ban

    @classmethod
    def neutral(cls, num_rows: int, vocab_size: int,
                device: torch.device | str) -> "DenseForms":
        return cls(torch.zeros(num_rows, vocab_size, dtype=torch.bool, device=device),
                   torch.zeros(num_rows, vocab_size, dtype=torch.float32, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill_(self.ban, float("-inf")).add_(self.bias)
