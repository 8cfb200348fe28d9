"""What the scheduler hands to the workers for one step (no tensors: cheap to broadcast)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from vllm.lora.request import LoRARequest
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the workers have not seen yet: sent once, in full."""
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    """The block table of KV cache group 0 (every layer's, with one group)."""
    num_computed_tokens: int
    wants_prompt_logprobs: bool
    lora_request: Optional[LoRARequest] = None
    """The request's LoRA adapter (None: the base model; see
    ModelRunnerBase.prepare_lora_mapping)."""
    pooling_params: Optional[PoolingParams] = None
    """Set for a pooling request: the runner pools its prompt instead of sampling."""
    mm_inputs: Optional[list[Any]] = None
    """The prompt's `MultiModalFeature`s (vllm/multimodal/inputs.py), None: text only.
    The runner merges their encoder outputs in (ModelRunnerBase.gather_mm_embeddings)."""
    group_block_ids: list[list[int]] = field(default_factory=list)
    """The block tables of KV cache groups 1.. (vllm/kv_cache_spec.py; empty with one
    group)."""


@dataclass
class CachedRequestData:
    """A request the workers already hold: only what changed.

    A request resumed after preemption is sent here too (`resumed_from_preemption`):
    the workers kept its state (token ids, sampling generator), so only its new block
    table and progress travel.
    """
    req_id: str
    new_block_ids: list[int]
    """Blocks appended this step; for a resumed request its whole new block table."""
    num_computed_tokens: int
    new_token_ids: list[int] = field(default_factory=list)
    """The last sampled token: ranks that did not sample it (other TP ranks, earlier
    pipeline stages) append it from here."""
    num_tokens: int = 0
    """Total tokens (prompt + output) the request has before this step."""
    resumed_from_preemption: bool = False
    new_group_block_ids: list[list[int]] = field(default_factory=list)
    """`new_block_ids` of KV cache groups 1.. (empty with one group)."""


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]
    """Tokens to compute this step per request; the batch follows this dict's order."""
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)
    """Requests finished or aborted since the last step: workers drop their state.
    Preempted requests are not in it: the workers keep their state for the resume."""
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    """Draft tokens scheduled per request (speculative decoding): they follow its known
    tokens in `num_scheduled_tokens` (see ModelRunnerBase.update_draft_tokens)."""
    structured_output_request_ids: dict[str, int] = field(default_factory=dict)
    """Constrained requests that sample this step -> their row of `grammar_bitmask`."""
    grammar_bitmask: Optional[np.ndarray] = None
    """[rows, ceil(vocab / 32)] int32: bit t % 32 of word t // 32 set = token t allowed.
    None when no request of the step is constrained (see
    vllm/worker/sampling_stage.py: SamplingStage.apply_logits_processors)."""

    free_encoder_mm_hashes: list[str] = field(default_factory=list)
    """Images whose encoder outputs the runner drops now (the scheduler's
    EncoderCacheManager evicted them; vllm/multimodal/encoder_cache.py)."""
    preempted_req_ids: set[str] = field(default_factory=set)
    """Requests preempted while scheduling this step: the workers free their state
    slots (state-space layers, vllm/worker/state_cache.py); they recompute on resume."""
    kv_connector_metadata: Optional[Any] = None
    """The KV connector's loads and saves of this step (a
    `vllm.kv_transfer.metadata.KVConnectorMetadata`; None without --kv-transfer-config)."""

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """Per scheduled request, in batch order."""
    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    """The tokens of a request that reached the end of its known tokens (one, or with
    speculative decoding its accepted drafts and one more), else []."""
    logprobs: Optional[list[Optional[list[tuple[list[int], list[float], int]]]]] = None
    """Per request: one (token ids [sampled, top-k...], logprobs, rank of sampled) per
    sampled token, or None."""
    prompt_logprobs: dict[str, tuple[list[list[int]], list[list[float]], list[int]]] = \
        field(default_factory=dict)
    """Per request with prompt logprobs: rows for the prompt positions computed this step."""
    pooler_output: dict[str, Any] = field(default_factory=dict)
    """Per pooling request whose prompt completed this step: its pooled vector (a CPU
    float32 tensor), from the pooling runner (vllm/worker/pooling_runner.py)."""
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    """Draft tokens proposed for each request's next step (speculative decoding; only
    requests with drafts)."""
    kv_connector_output: Optional[Any] = None
    """What the KV connector reports (`vllm.kv_transfer.metadata.KVConnectorOutput`:
    requests whose KV failed to load), or None."""
    failed_req_ids: dict[str, str] = field(default_factory=dict)
    """Requests the runner could not continue (a custom logits processor raised on
    them) -> why: the scheduler ends them with finish reason "error"."""
