"""bad_words: the next token is forbidden where it would complete a bad word."""
from __future__ import annotations

from typing import Optional

import torch

from vllm.sample.logits_processors.base import BuildContext, BuiltinLogitsProcessor
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import SamplingMetadata
from vllm.sample.ops.logit_masks import apply_bad_words
from vllm.sampling_params import SamplingParams

BadWordsInputs = list[tuple[int, list[list[int]], list[int]]]
"""(logits row, the request's bad-word token sequences, its output token list, read
live at each step) per row with bad words."""


class BadWordsProcessor(BuiltinLogitsProcessor):
    name = "bad_words"

    def activates(self, params: SamplingParams) -> bool:
        return bool(params.bad_words_token_ids) or bool(params.bad_words)

    def holds_drafts_back(self, params: SamplingParams, num_output_tokens: int) -> bool:
        return any(len(seq) > 1 for seq in params.bad_words_token_ids or ())

    def build(self, ctx: BuildContext) -> Optional[BadWordsInputs]:
        found = [(i, r.params.bad_words_token_ids, r.output_token_ids)
                 for i, r in enumerate(ctx.srows) if r.params.bad_words_token_ids]
        return found or None

    def apply(self, logits: torch.Tensor, inputs: BadWordsInputs,
              static_shapes: bool) -> torch.Tensor:
        return apply_bad_words(logits, inputs)

    def per_step(self, inputs: Optional[BadWordsInputs]) -> bool:
        """A word of several tokens bans by the latest output: its mask (fixed shapes)
        is as of one step."""
        return any(len(seq) > 1 for _, seqs, _ in inputs or () for seq in seqs)

    def fixed_form(self, inputs: Optional[BadWordsInputs], md: SamplingMetadata,
                   dense: DenseForms, state: object = None) -> None:
        if inputs is not None:
            banned = apply_bad_words(torch.zeros(md.num_rows, md.vocab_size,
                                                 device=dense.ban.device), inputs)
            dense.ban |= torch.isneginf(banned)
