"""A request as the engine core sees it: token ids, progress and status."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from vllm.lora.request import LoRARequest
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vllm.multimodal.inputs import MultiModalFeature
    from vllm.structured_output.request import StructuredOutputRequest


class RequestStatus(enum.IntEnum):
    WAITING = 0
    WAITING_FOR_FSM = 1
    """Waiting for its structured-output grammar to compile."""
    RUNNING = 2
    PREEMPTED = 3
    # Everything from here on is finished.
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_IGNORED = 7
    FINISHED_ERROR = 8
    """Ended by a failure of its own (its KV could not be loaded from another engine)."""

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status >= RequestStatus.FINISHED_STOPPED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> Optional[str]:
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class Request:
    """One sequence to generate. (n > 1 is fanned out into n Requests by the frontend.)

    `all_token_ids` is prompt + output; `num_computed_tokens` counts the tokens whose
    KV is in the cache. A request needs `num_tokens - num_computed_tokens` tokens of
    compute to catch up, which is how prefill, chunked prefill, decode and
    recompute-after-preemption become one rule.
    """
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: Optional[int]
    arrival_time: float = field(default_factory=time.time)
    max_tokens: int = 16

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0
    """Tokens sampled by steps still running (async scheduling): scheduled for, not
    known yet. The workers feed them as inputs; the scheduler only counts them."""
    num_cached_tokens: int = -1
    """Prompt tokens not computed here on first scheduling (-1 until then): local
    prefix-cache hits plus tokens a KV connector loaded, as vLLM counts them."""
    stop_reason: Optional[int | str] = None
    block_hashes: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    prompt_logprobs_done: bool = False
    lora_request: Optional[LoRARequest] = None
    pooling_params: Optional[PoolingParams] = None
    """Set for a pooling request: one step over the whole prompt, then the pooler's
    output instead of a token (its sampling_params are a neutral one-token stand-in)."""
    spec_token_ids: list[int] = field(default_factory=list)
    """Draft tokens proposed for the request's next step (speculative decoding)."""
    mm_features: Optional[list["MultiModalFeature"]] = None
    """The prompt's images (vllm/multimodal), in prompt order; None: text only."""
    num_external_computed_tokens: int = 0
    """Prompt tokens whose KV a KV connector loaded from another engine (vllm/kv_transfer)."""
    priority: int = 0
    """The request's priority under --scheduling-policy priority: lower runs first
    (vLLM's convention); 0 under fcfs."""
    cache_salt: Optional[str] = None
    """The prompt's cache_salt: part of its first block's hash, so only requests with the
    same salt share its prefix-cache blocks (vLLM's cache isolation between tenants)."""

    @property
    def lora_int_id(self) -> int:
        """The adapter's id, 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request else 0
    structured_output_request: Optional["StructuredOutputRequest"] = None
    """The request's grammar state when it asked for structured outputs."""

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> Optional[str]:
        return RequestStatus.get_finished_reason(self.status)

    @property
    def use_structured_output(self) -> bool:
        return self.structured_output_request is not None

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling_params.prompt_logprobs is not None and not self.prompt_logprobs_done
