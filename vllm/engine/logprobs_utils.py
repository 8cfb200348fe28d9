"""Sampler logprob rows -> the `Logprob` dicts of `CompletionOutput` and `RequestOutput`.

A row is (token ids, logprobs, rank of the first): column 0 is the sampled (or prompt)
token, then the top-K alternatives with ranks 1..K. Each request asked for its own K
(`logprobs` / `prompt_logprobs`); the batch computed the largest, so rows are cut to
the request's K here.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from vllm.sample.logprobs import LogprobsLists
from vllm.sequence import Logprob, PromptLogprobs, SampleLogprobs

TokenDecoder = Callable[[int], str]


def make_logprob_dict(token_ids: Sequence[int], logprobs: Sequence[float],
                      selected_rank: int, num_logprobs: int,
                      decode: Optional[TokenDecoder] = None) -> dict[int, Logprob]:
    """The selected token first (with its true rank), then the top num_logprobs.

    When the selected token is also in the top-K it appears once, with its rank.
    """
    out = {int(token_ids[0]): Logprob(float(logprobs[0]), int(selected_rank),
                                      decode(int(token_ids[0])) if decode else None)}
    for rank, (token, value) in enumerate(zip(token_ids[1:num_logprobs + 1],
                                              logprobs[1:num_logprobs + 1]), start=1):
        token = int(token)
        if token not in out:
            out[token] = Logprob(float(value), rank, decode(token) if decode else None)
    return out


class RequestLogprobs:
    """Accumulates one request's sample and prompt logprobs across steps.

    `logprobs` / `prompt_logprobs` stay None when the request did not ask for them,
    as in vLLM's outputs; `cumulative_logprob` likewise.
    """

    def __init__(self, num_logprobs: Optional[int], num_prompt_logprobs: Optional[int],
                 decode: Optional[TokenDecoder] = None) -> None:
        self.num_logprobs = num_logprobs
        self.num_prompt_logprobs = num_prompt_logprobs
        self.decode = decode
        self.logprobs: Optional[SampleLogprobs] = [] if num_logprobs is not None else None
        self.cumulative_logprob: Optional[float] = 0.0 if num_logprobs is not None else None
        self.prompt_logprobs: Optional[PromptLogprobs] = (
            [] if num_prompt_logprobs is not None else None)

    def add_sample(self, lists: LogprobsLists) -> list[dict[int, Logprob]]:
        """Append one entry per row (one row per token generated this step)."""
        if self.logprobs is None:
            return []
        new = [make_logprob_dict(ids, values, rank, self.num_logprobs, self.decode)
               for ids, values, rank in zip(*lists)]
        self.logprobs.extend(new)
        self.cumulative_logprob += sum(float(values[0]) for values in lists.logprobs)
        return new

    def add_prompt(self, lists: LogprobsLists) -> list[Optional[dict[int, Logprob]]]:
        """Append a chunk of prompt rows; the first prompt token gets None (no context)."""
        if self.prompt_logprobs is None:
            return []
        new: list[Optional[dict[int, Logprob]]] = []
        if not self.prompt_logprobs:
            new.append(None)
        new.extend(make_logprob_dict(ids, values, rank, self.num_prompt_logprobs, self.decode)
                   for ids, values, rank in zip(*lists))
        self.prompt_logprobs.extend(new)
        return new
