"""What generation returns: one `RequestOutput` per prompt, one `CompletionOutput` per sample."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from vllm.sequence import PromptLogprobs, SampleLogprobs


@dataclass
class RequestMetrics:
    """Timestamps (seconds, `time.time()`) of one request's life in the engine."""
    arrival_time: float
    last_token_time: Optional[float] = None
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    finished_time: Optional[float] = None
    num_preemptions: int = 0
    """Times the request (its most preempted sample, with n > 1) was preempted."""


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    finish_reason is None while generating, then "stop" (eos, stop string or stop
    token) or "length" (max_tokens or max_model_len) or "abort"; stop_reason is the
    stop string or stop token id that ended it (None for eos or length).
    """
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Optional[int | str] = None
    lora_request: Optional[Any] = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"CompletionOutput(index={self.index}, "
                f"text={self.text!r}, "
                f"token_ids={self.token_ids}, "
                f"cumulative_logprob={self.cumulative_logprob}, "
                f"logprobs={self.logprobs}, "
                f"finish_reason={self.finish_reason}, "
                f"stop_reason={self.stop_reason})")


class RequestOutput:
    """The state of one request: its prompt and its completion(s) so far.

    With output_kind DELTA, `outputs` hold only what is new since the last output;
    `add` merges such deltas back (used when several child samples stream together).
    """

    def __init__(
        self,
        request_id: str,
        prompt: Optional[str],
        prompt_token_ids: Optional[list[int]],
        prompt_logprobs: Optional[PromptLogprobs],
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Optional[RequestMetrics] = None,
        lora_request: Optional[Any] = None,
        num_cached_tokens: Optional[int] = 0,
        kv_transfer_params: Optional[dict[str, Any]] = None,
        num_external_computed_tokens: int = 0,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.num_cached_tokens = num_cached_tokens
        self.kv_transfer_params = kv_transfer_params
        """Set when the request finished on an engine with a KV connector that published
        its KV (a prefill instance): where another engine finds it (vLLM's field)."""
        self.num_external_computed_tokens = num_external_computed_tokens
        """Prompt tokens whose KV was loaded from another engine (prefill/decode
        disaggregation), not computed or found in the prefix cache here."""

    def add(self, next_output: "RequestOutput", aggregate: bool) -> None:
        """Merge a later output of the same request into this one.

        aggregate=True appends the new text, tokens and logprobs (DELTA outputs being
        collected); False replaces each completion by its newer version.
        """
        self.finished |= next_output.finished
        if next_output.num_cached_tokens is not None:
            self.num_cached_tokens = next_output.num_cached_tokens
        if next_output.kv_transfer_params is not None:
            self.kv_transfer_params = next_output.kv_transfer_params
        self.num_external_computed_tokens = next_output.num_external_computed_tokens
        if next_output.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = next_output.prompt_logprobs
        for completion in next_output.outputs:
            for i, mine in enumerate(self.outputs):
                if mine.index != completion.index:
                    continue
                if aggregate:
                    _extend_completion(mine, completion)
                else:
                    self.outputs[i] = completion
                break
            else:
                self.outputs.append(completion)

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id}, "
                f"prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, "
                f"prompt_logprobs={self.prompt_logprobs}, "
                f"outputs={self.outputs}, "
                f"finished={self.finished}, "
                f"metrics={self.metrics}, "
                f"lora_request={self.lora_request}, "
                f"num_cached_tokens={self.num_cached_tokens})")


def _extend_completion(into: CompletionOutput, delta: CompletionOutput) -> None:
    into.text += delta.text
    into.token_ids = list(into.token_ids) + list(delta.token_ids)
    if delta.logprobs:
        into.logprobs = (into.logprobs or []) + list(delta.logprobs)
    into.cumulative_logprob = delta.cumulative_logprob
    into.finish_reason = delta.finish_reason
    into.stop_reason = delta.stop_reason


from vllm.pooling_outputs import (ClassificationOutput, ClassificationRequestOutput,  # noqa: E402
                                  EmbeddingOutput, EmbeddingRequestOutput, PoolingOutput,
                                  PoolingRequestOutput, ScoringOutput, ScoringRequestOutput)

__all__ = ["RequestMetrics", "CompletionOutput", "RequestOutput", "PoolingOutput",
           "PoolingRequestOutput", "EmbeddingOutput", "EmbeddingRequestOutput",
           "ClassificationOutput", "ClassificationRequestOutput", "ScoringOutput",
           "ScoringRequestOutput"]
