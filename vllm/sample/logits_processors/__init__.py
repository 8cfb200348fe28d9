"""The table of sampling knobs: one `BuiltinLogitsProcessor` per knob, in the order
they apply (vLLM's sampler order), and the questions the engine asks of all of them.

Everything that depends on which knobs exist reads this table: the persistent batch
(per-row state, the greedy fast path, when cached metadata expires), the metadata
build (`SamplingState.metadata`), the sampler and the rejection sampler
(`apply_logits`, `apply_probs`), speculative decoding (`holds_drafts_back`), and the
HPU's fixed shapes and warmup (vllm/hpu/sampling.py). Adding a knob is one file here
and one entry in `BUILTIN_PROCESSORS`.

User-written processors (vLLM's `LogitsProcessor` API: interface.py, custom.py) are
applied by the runner on the logits of each pass, before this table.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from vllm.sample.logits_processors.allowed_token_ids import AllowedTokenIdsProcessor
from vllm.sample.logits_processors.bad_words import BadWordsProcessor
from vllm.sample.logits_processors.base import BuiltinLogitsProcessor
from vllm.sample.logits_processors.dense import DENSE
from vllm.sample.logits_processors.logit_bias import LogitBiasProcessor
from vllm.sample.logits_processors.min_p import MinPProcessor
from vllm.sample.logits_processors.min_tokens import MinTokensProcessor
from vllm.sample.logits_processors.penalties import PenaltiesProcessor
from vllm.sample.logits_processors.temperature import TemperatureProcessor
from vllm.sample.logits_processors.thinking_budget import ThinkingBudgetProcessor
from vllm.sample.logits_processors.top_k_top_p import TopKTopPProcessor
from vllm.sample.metadata import SamplingMetadata, is_greedy
from vllm.sampling_params import SamplingParams

BUILTIN_PROCESSORS: tuple[BuiltinLogitsProcessor, ...] = (
    # "logits": every row, before the argmax (forbidding knobs, then bias, then
    # penalties).
    AllowedTokenIdsProcessor(),
    MinTokensProcessor(),
    BadWordsProcessor(),
    ThinkingBudgetProcessor(),
    LogitBiasProcessor(),
    PenaltiesProcessor(),
    # "probs": random rows, after the argmax.
    TemperatureProcessor(),
    MinPProcessor(),
    TopKTopPProcessor(),
)

LOGITS_PROCESSORS = tuple(p for p in BUILTIN_PROCESSORS if p.stage == "logits")
PROBS_PROCESSORS = tuple(p for p in BUILTIN_PROCESSORS if p.stage == "probs")


def argmax_from(params: SamplingParams) -> Optional[int]:
    """Output count from which the row's token is the plain argmax of its raw logits
    (greedy, no logprobs, no knob editing the logits any more); None: never."""
    if not is_greedy(params) or params.logprobs is not None:
        return None
    counts = [p.argmax_from(params) for p in LOGITS_PROCESSORS]
    return None if None in counts else max(counts, default=0)


def needs_only_argmax(params: SamplingParams, num_output_tokens: int) -> bool:
    """True when the row's token is the plain argmax of the raw logits: such a batch
    skips the metadata and the sampler entirely (the greedy fast path)."""
    start = argmax_from(params)
    return start is not None and num_output_tokens >= start


def holds_drafts_back(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether some knob's effect depends on the output so far (speculative decoding
    then proposes no drafts for the request)."""
    return any(p.holds_drafts_back(params, num_output_tokens) for p in BUILTIN_PROCESSORS)


def apply_logits(logits: torch.Tensor, md: SamplingMetadata,
                 static_shapes: bool = False) -> torch.Tensor:
    """Every "logits" knob the batch uses, in table order (fixed shapes: the shared
    dense forms first, then the knobs with their own)."""
    inputs = md.logits_inputs
    if DENSE in inputs:
        logits = inputs[DENSE].apply(logits)
    for processor in LOGITS_PROCESSORS:
        own = inputs.get(processor.name)
        if own is not None:
            logits = processor.apply(logits, own, static_shapes)
    return logits


def apply_probs(logits: torch.Tensor, md: SamplingMetadata, sampler: Any) -> torch.Tensor:
    """Every "probs" knob on the (processed, float32) logits, in place."""
    for processor in PROBS_PROCESSORS:
        logits = processor.apply_probs(logits, md, sampler)
    return logits


__all__ = ["BUILTIN_PROCESSORS", "LOGITS_PROCESSORS", "PROBS_PROCESSORS",
           "BuiltinLogitsProcessor", "argmax_from", "needs_only_argmax",
           "holds_drafts_back", "apply_logits", "apply_probs"]
