"""thinking_token_budget: once a request has produced `thinking_token_budget` output
tokens without ending its reasoning, the end-of-reasoning sequence
(`thinking_end_token_ids`, resolved by the frontend from the server's reasoning parser)
is forced, one token per step; generation then goes on unconstrained (the answer).

Reasoning is counted from the start of the output when the prompt opened it (the
template wrote `<think>`), else from the end of the output's first start sequence
(`thinking_start_token_ids`: the model opens its reasoning itself; nothing is forced
before it does), as vLLM counts from the think start. A request whose reasoning holds
the end sequence within its first `thinking_token_budget` tokens ended it itself and is
left alone. The knob acts only at the reasoning counts N .. N + len(end) - 1 (N the
budget), where it masks every token of the row but the next one of the sequence (fixed
shapes: the same mask folded into the dense [N, V] ban row). Only the first reasoning
block is budgeted.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from vllm.sample.logits_processors.base import BuildContext, BuiltinLogitsProcessor
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import SamplingMetadata, SamplingRow
from vllm.sampling_params import SamplingParams

ThinkingBudgetInputs = list[tuple[int, int, list[int], Sequence[int], Optional[list[int]]]]
"""(logits row, budget, end sequence, the request's output token list read live at
each step, the start sequence or None) per row with the budget still ahead or being
enforced."""


def reasoning_begins(start: Optional[Sequence[int]], output: Sequence[int]) -> Optional[int]:
    """Output index where the budgeted reasoning begins: 0 without a start sequence (the
    prompt opened it), else just after the output's first start sequence; None while
    the model has not opened its reasoning."""
    if not start:
        return 0
    at = _find(output, start)
    return None if at < 0 else at + len(start)


def forced_token(budget: int, end: Sequence[int], output: Sequence[int],
                 begin: Optional[int] = 0) -> Optional[int]:
    """The token the row must produce next, or None (reasoning not begun or not yet at
    the budget, ended by the model before it, or the end sequence already forced)."""
    if begin is None or not end:
        return None
    count = len(output) - begin
    if count < budget or count >= budget + len(end):
        return None
    if _contains(output[begin:begin + budget], end):
        return None
    return end[count - budget]


def _find(seq: Sequence[int], pattern: Sequence[int]) -> int:
    n, first, pattern = len(pattern), pattern[0], list(pattern)
    seq = list(seq)
    for i in range(len(seq) - n + 1):
        if seq[i] == first and seq[i:i + n] == pattern:
            return i
    return -1


def _contains(seq: Sequence[int], pattern: Sequence[int]) -> bool:
    n = len(pattern)
    first = pattern[0]
    seq = list(seq)
    return any(seq[i] == first and seq[i:i + n] == list(pattern)
               for i in range(len(seq) - n + 1))


class ThinkingBudgetProcessor(BuiltinLogitsProcessor):
    name = "thinking_token_budget"
    expires = True

    def activates(self, params: SamplingParams) -> bool:
        return (params.thinking_token_budget is not None
                and bool(params.thinking_end_token_ids))

    def _done_at(self, params: SamplingParams) -> int:
        return params.thinking_token_budget + len(params.thinking_end_token_ids)

    def _begin(self, row: SamplingRow) -> Optional[int]:
        return reasoning_begins(row.params.thinking_start_token_ids, row.output_token_ids)

    def in_force(self, row: SamplingRow) -> bool:
        if not self.activates(row.params):
            return False
        begin = self._begin(row)
        return begin is None or len(row.output_token_ids) < begin + self._done_at(row.params)

    def argmax_from(self, params: SamplingParams) -> Optional[int]:
        if not self.activates(params):
            return 0
        if params.thinking_start_token_ids:
            return None  # where the reasoning starts is up to the model: never skipped
        return self._done_at(params)

    def holds_drafts_back(self, params: SamplingParams, num_output_tokens: int) -> bool:
        if not self.activates(params):
            return False
        return bool(params.thinking_start_token_ids) or \
            num_output_tokens < self._done_at(params)

    def build(self, ctx: BuildContext) -> Optional[ThinkingBudgetInputs]:
        found = [(i, r.params.thinking_token_budget, list(r.params.thinking_end_token_ids),
                  r.output_token_ids, r.params.thinking_start_token_ids)
                 for i, r in enumerate(ctx.srows) if self.in_force(r)]
        return found or None

    @staticmethod
    def _forced(inputs: ThinkingBudgetInputs, vocab: int) -> tuple[list[int], list[int]]:
        rows: list[int] = []
        tokens: list[int] = []
        for row, budget, end, output, start in inputs:
            # Read live: inputs may outlive a step, the start may come any time.
            token = forced_token(budget, end, output, reasoning_begins(start, output))
            if token is not None and token < vocab:
                rows.append(row)
                tokens.append(token)
        return rows, tokens

    def apply(self, logits: torch.Tensor, inputs: ThinkingBudgetInputs,
              static_shapes: bool) -> torch.Tensor:
        rows, tokens = self._forced(inputs, logits.shape[-1])
        if rows:
            index = torch.tensor(rows, device=logits.device)
            keep = torch.tensor(tokens, device=logits.device)
            logits[index] = float("-inf")
            logits[index, keep] = 0.0
        return logits

    def per_step(self, inputs: Optional[ThinkingBudgetInputs]) -> bool:
        """The forced token moves with the output count: a mask as of one step."""
        return bool(inputs)

    def fixed_form(self, inputs: Optional[ThinkingBudgetInputs], md: SamplingMetadata,
                   dense: DenseForms, state: object = None) -> None:
        if inputs is None:
            return
        rows, tokens = self._forced(inputs, md.vocab_size)
        if rows:
            index = torch.tensor(rows, device=dense.ban.device)
            keep = torch.tensor(tokens, device=dense.ban.device)
            dense.ban[index] = True
            dense.ban[index, keep] = False
