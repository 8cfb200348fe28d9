"""vLLM V1-style scheduler: one token budget per step, running requests first.

There are no prefill or decode phases: each request needs
`num_tokens - num_computed_tokens` tokens computed, and the step's budget
(`max_num_batched_tokens`) is handed out to running requests, then to waiting
ones, so long prompts chunk naturally. When the KV pool runs dry the most recently
started running request is preempted by recompute: its blocks are freed, its
progress reset, and it goes back to the front of the waiting queue. The workers
keep their state for it (token ids, seeded generator): it is not reported
finished, and when it is scheduled again it is sent as a resumed cached request
with its new block table. Under --scheduling-policy priority both queues are kept in
priority order and a better-ranked waiting request may preempt the worst running one
(vllm/core/sched_policy.py).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from vllm.config import VllmConfig
from vllm.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.core.kv_cache_manager import KVCacheManager
from vllm.kv_cache_spec import KVCacheConfig
from vllm.kv_transfer.factory import KVConnectorFactory, KVConnectorRole
from vllm.multimodal.encoder_cache import EncoderCacheManager, schedule_encoder_inputs
from vllm.core.sched_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                    SchedulerOutput)
from vllm.core.sched_policy import PRIORITY, insert_by_priority, priority_key
from vllm.request import Request, RequestStatus
from vllm.spec_decode.metrics import SpecDecodingStats
from vllm.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_deferred_reqs: int = 0
    """Waiting requests the last admission pass skipped for a reason other than capacity
    (grammar still compiling, no LoRA slot)."""
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    """LoRA adapter name -> running requests using it."""
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    """LoRA adapter name -> waiting requests using it."""
    spec_decoding_stats: Optional[SpecDecodingStats] = None
    """Draft acceptance counts (cumulative) when speculative decoding is on."""
    kv_cache_eviction_events: list = field(default_factory=list)
    """`KVCacheEvictionEvent`s of sampled blocks since the last stats (--kv-cache-metrics)."""
    external_prefix_cache_queries: int = 0
    """Prompt tokens of admitted requests while a KV connector was asked (cumulative)."""
    external_prefix_cache_hits: int = 0
    """Prompt tokens a KV connector supplied (KV offloading: host-memory hits)."""
    kv_offload: Optional[dict[str, int]] = None
    """KV offloading's cumulative counts (stored_blocks, loaded_blocks, block_bytes,
    used_blocks); None without it."""


@dataclass
class EngineCoreOutput:
    """What one step produced for one request."""
    request_id: str
    new_token_ids: list[int]
    new_logprobs: Optional[list[tuple[list[int], list[float], int]]] = None
    new_prompt_logprobs: Optional[tuple[list[list[int]], list[list[float]], list[int]]] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[int | str] = None
    num_cached_tokens: int = 0
    pooling_output: Optional[Any] = None
    """A pooling request's vector (CPU tensor), with its finish."""
    num_preemptions: int = 0
    """Times the request was preempted so far (vllm:request_num_preemptions)."""
    num_external_computed_tokens: int = 0
    """Prompt tokens whose KV came from another engine (KV transfer)."""
    error: Optional[str] = None
    """Why the request failed before producing anything (its grammar could not be
    compiled): the frontend raises it as a ValueError, a 400 on the server."""
    kv_transfer_params: Optional[dict[str, Any]] = None
    """Set on a finished request by the KV connector (where another engine finds its
    KV: what a disaggregated-serving proxy forwards to the decode instance)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Scheduler:

    def __init__(self, vllm_config: VllmConfig, num_blocks: int,
                 kv_cache_config: Optional[KVCacheConfig] = None) -> None:
        sc = vllm_config.scheduler_config
        self.max_num_seqs = sc.max_num_seqs
        self.max_num_batched_tokens = sc.max_num_batched_tokens
        self.enable_chunked_prefill = sc.enable_chunked_prefill
        self.whole_images = getattr(sc, "disable_chunked_mm_input", False)
        self.policy = sc.policy
        self.async_scheduling = (sc.async_scheduling and
                                 getattr(vllm_config, "speculative_config", None) is None)
        """Progress is booked when a step is scheduled, not when its tokens come back:
        the next step can be scheduled while this one runs (see _book_scheduled). Not
        with speculative decoding: a step's drafts come from the previous step's accepted
        tokens, so the engine waits for them (EngineCore._must_sync) and books them when
        they are back, as without async scheduling."""
        self.max_model_len = vllm_config.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        self.kv_cache_manager = KVCacheManager(
            num_blocks, self.block_size, vllm_config.cache_config.enable_prefix_caching,
            kv_cache_config)
        obs = getattr(vllm_config, "observability_config", None)
        if obs is not None and obs.kv_cache_metrics:
            self.kv_cache_manager.block_pool.metrics_collector = KVCacheMetricsCollector(
                obs.kv_cache_metrics_sample)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.preempted_req_ids: set[str] = set()
        """Preempted since the last SchedulerOutput (sent in it: state slots free)."""
        self.num_deferred_reqs = 0
        lora_config = vllm_config.lora_config
        self.max_loras = lora_config.max_loras if lora_config is not None else 0
        self.structured_output_manager = StructuredOutputManager(vllm_config)
        # Image encoder work per step and the runner's encoder cache, in placeholder
        # tokens: at least a whole prompt's worth, so any image that fits fits here.
        self.encoder_budget = max(self.max_num_batched_tokens, self.max_model_len)
        self.encoder_cache_manager = EncoderCacheManager(self.encoder_budget)
        self._failed_outputs: list[EngineCoreOutput] = []
        """Outputs of requests that ended without being scheduled (grammar compile failed)."""
        spec = getattr(vllm_config, "speculative_config", None)
        self.num_spec_tokens = spec.num_speculative_tokens if spec is not None else 0
        self.spec_decoding_stats = (SpecDecodingStats(self.num_spec_tokens)
                                    if spec is not None else None)
        self.num_lookahead_tokens = (self.num_spec_tokens
                                     if getattr(spec, "use_draft_model", False) else 0)
        """KV slots reserved past each step's tokens for a draft model's drafts."""
        self.connector = (KVConnectorFactory.create_connector(vllm_config,
                                                              KVConnectorRole.SCHEDULER)
                          if getattr(vllm_config, "kv_transfer_config", None) else None)
        """The KV connector's scheduler half (vllm/kv_transfer), None without one."""
        bind = getattr(self.connector, "bind_kv_cache", None)
        if bind is not None:  # KV offloading: sized from, and reading, the KV cache
            bind(kv_cache_config, self.kv_cache_manager)
        self.external_queries = 0
        self.external_hits = 0

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        if request.use_structured_output:
            # Compiled in a worker thread; the request waits until its grammar is ready.
            request.status = RequestStatus.WAITING_FOR_FSM
            self.structured_output_manager.grammar_init(request)
        if self.policy == PRIORITY:
            insert_by_priority(self.waiting, request)
        else:
            self.waiting.append(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """Abort / stop requests from outside (client gone, stop string matched)."""
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)

    def _free_request(self, request: Request) -> Optional[dict[str, Any]]:
        """Release the request; returns the kv_transfer_params for its output."""
        params = None
        if self.connector is not None:
            _, params = self.connector.request_finished(
                request, self.kv_cache_manager.get_block_ids(request.request_id))
        self.kv_cache_manager.free(request)
        self.encoder_cache_manager.release(request.request_id, request.mm_features)
        if request.use_structured_output:
            self.structured_output_manager.release(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
        return params

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def has_finished_requests(self) -> bool:
        """Finished ids not yet sent to the workers (the next step must carry them)."""
        return bool(self.finished_req_ids)

    def has_requests(self) -> bool:
        """Whether a step has anything to do: requests to run or finished ids to send."""
        return self.has_unfinished_requests() or self.has_finished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    # ------------------------------------------------------------ schedule
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        preemptions_before = self.num_preemptions
        loras: set[int] = set()  # distinct adapters of this step (one device slot each)
        self._encoder_left = self.encoder_budget

        spec_tokens: dict[str, list[int]] = {}
        idx = 0
        while idx < len(self.running) and budget > 0:
            request = self.running[idx]
            drafts = self._drafts_to_schedule(request, budget)
            num_new = min(_num_pending(request) + len(drafts), budget)
            if (num_new <= 0 or not self._lora_fits(request, loras)
                    or self._has_enough_in_flight(request)):
                idx += 1
                continue
            wanted = num_new
            num_new, to_encode = self._fit_encoder_inputs(request, request.num_computed_tokens,
                                                          num_new)
            if num_new <= 0:
                idx += 1
                continue
            if num_new < wanted:
                drafts = []  # cut before an image: still in the prompt, no drafts
            new_blocks = self._allocate_or_preempt(request, num_new)
            if new_blocks is None:
                break  # the request itself was preempted
            self._book_encoder_inputs(request, to_encode)
            num_scheduled[request.request_id] = num_new
            if drafts:
                spec_tokens[request.request_id] = drafts
            budget -= num_new
            self._record_running(request, new_blocks, new_reqs, cached_reqs)
            if request.lora_int_id:
                loras.add(request.lora_int_id)
            idx += 1
        # After a preemption the pool is tight: admit nobody new this step.
        if self.num_preemptions == preemptions_before:
            budget = self._schedule_waiting(budget, num_scheduled, new_reqs, cached_reqs,
                                            loras, spec_tokens)

        so_ids, bitmask = self._grammar_bitmask(num_scheduled, spec_tokens)
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids, scheduled_spec_decode_tokens=spec_tokens,
            structured_output_request_ids=so_ids, grammar_bitmask=bitmask,
            free_encoder_mm_hashes=self.encoder_cache_manager.take_freed(),
            preempted_req_ids=self.preempted_req_ids)
        self.preempted_req_ids = set()
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        self.finished_req_ids = set()
        if self.async_scheduling:
            self._book_scheduled(num_scheduled)
        return out

    # ------------------------------------------------------- async scheduling
    def _book_scheduled(self, num_scheduled: dict[str, int]) -> None:
        """Count a step's tokens as computed now, and the token it will sample as a
        placeholder, so that the next schedule (while this step runs) continues after
        it. The workers hold the sampled tokens: they feed a placeholder position from
        their own state."""
        for req_id, n in num_scheduled.items():
            request = self.requests[req_id]
            request.num_computed_tokens += n
            if request.num_computed_tokens >= \
                    request.num_tokens + request.num_output_placeholders:
                request.num_output_placeholders += 1

    def _has_enough_in_flight(self, request: Request) -> bool:
        """Whether the steps in flight already sample the request's last token
        (max_tokens or the model length): one more would be thrown away."""
        if not request.num_output_placeholders:
            return False
        return (request.num_output_tokens + request.num_output_placeholders
                >= request.max_tokens
                or request.num_tokens + request.num_output_placeholders
                >= self.max_model_len)

    def needs_sync(self) -> bool:
        """Whether the next schedule must see the tokens of the step in flight: a
        grammar must accept a token before the next bitmask, prompt logprobs track
        progress by the tokens that came back, and a pooling request ends with its
        prompt's step (it has no next one)."""
        return any(r.use_structured_output or r.wants_prompt_logprobs
                   or r.pooling_params is not None for r in self.requests.values())

    def _drafts_to_schedule(self, request: Request, budget: int) -> list[int]:
        """The request's proposed drafts this step may verify: only for a request that
        is caught up (one known token left to compute), cut so that the k + 1 tokens
        fit the budget, max_tokens and max_model_len (no overshoot)."""
        drafts = request.spec_token_ids
        if not drafts or request.num_tokens - request.num_computed_tokens != 1:
            return []
        room = min(budget, request.max_tokens - request.num_output_tokens,
                   self.max_model_len - request.num_tokens) - 1
        drafts = drafts[:max(room, 0)]
        if drafts and request.use_structured_output:
            # Only drafts the grammar allows: the verification rows are masked by it.
            drafts = self.structured_output_manager.valid_draft_prefix(request, drafts)
        return drafts

    def _lookahead(self, request: Request, num_new: int) -> int:
        """Slots to reserve past the step's tokens for draft-model drafts (within
        max_model_len)."""
        end = request.num_computed_tokens + num_new
        return max(0, min(self.num_lookahead_tokens, self.max_model_len - end))

    def _lora_fits(self, request: Request, loras: set[int]) -> bool:
        """Whether the request's adapter has a device slot in this step: it is the base
        model, its adapter is already in the step, or a slot is still free."""
        lora_id = request.lora_int_id
        return not lora_id or lora_id in loras or len(loras) < self.max_loras

    def _grammar_bitmask(self, num_scheduled: dict[str, int],
                         spec_tokens: dict[str, list[int]]):
        """Bitmask rows of the constrained requests that sample this step (one more
        per draft token they verify)."""
        sampling = []
        for req_id, n in num_scheduled.items():
            request = self.requests[req_id]
            if (request.use_structured_output
                    and request.num_computed_tokens + n >= request.num_tokens):
                sampling.append(request)
        if not sampling:
            return {}, None
        return self.structured_output_manager.grammar_bitmask(sampling, spec_tokens)

    def _allocate_or_preempt(self, request: Request, num_new: int):
        """Allocate slots, preempting from the back of `running` until it fits."""
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new, num_lookahead_tokens=self._lookahead(request, num_new))
            if new_blocks is not None:
                return new_blocks
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return None

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.spec_token_ids = []
        self.encoder_cache_manager.release(request.request_id, request.mm_features)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.preempted_req_ids.add(request.request_id)
        request.num_preemptions += 1
        self.num_preemptions += 1
        if self.policy == PRIORITY:
            insert_by_priority(self.waiting, request)
        else:
            self.waiting.appendleft(request)
        logger.debug("Preempted request %s (recompute)", request.request_id)

    def _record_running(self, request, new_blocks, new_reqs, cached_reqs) -> None:
        # A running request samples at most 1 + k tokens per step (k: drafts), so its
        # last 1 + k output tokens are all a rank that did not sample can be missing.
        cached_reqs.append(CachedRequestData(
            req_id=request.request_id, new_block_ids=[b.block_id for b in new_blocks],
            new_group_block_ids=self.kv_cache_manager.new_group_block_ids.get(
                request.request_id, []),
            num_computed_tokens=request.num_computed_tokens,
            new_token_ids=request.output_token_ids[-(1 + self.num_spec_tokens):],
            num_tokens=request.num_tokens))

    def _preempt_for(self, request: Request, num_scheduled: dict[str, int],
                     cached_reqs: list[CachedRequestData],
                     spec_tokens: dict[str, list[int]]) -> Optional[int]:
        """Priority policy: make room for the waiting `request` by preempting the worst
        running request (the back of the sorted `running`) if it ranks strictly below
        it; its part of this step is withdrawn. Returns the step tokens given back
        (None: nothing to preempt, `request` waits)."""
        if self.policy != PRIORITY or not self.running:
            return None
        victim = self.running[-1]
        if priority_key(victim) <= priority_key(request):
            return None
        self.running.pop()
        freed = num_scheduled.pop(victim.request_id, 0)
        if freed:
            cached_reqs[:] = [c for c in cached_reqs if c.req_id != victim.request_id]
            spec_tokens.pop(victim.request_id, None)
        self._preempt(victim)
        logger.debug("Request %s (priority %d) preempted %s (priority %d)",
                     request.request_id, request.priority, victim.request_id,
                     victim.priority)
        return freed

    def _add_running(self, request: Request) -> None:
        if self.policy == PRIORITY:
            insert_by_priority(self.running, request)
        else:
            self.running.append(request)

    def _schedule_waiting(self, budget: int, num_scheduled: dict[str, int],
                          new_reqs: list[NewRequestData],
                          cached_reqs: list[CachedRequestData], loras: set[int],
                          spec_tokens: dict[str, list[int]]) -> int:
        """Admit waiting requests in order; one whose adapter would need a slot beyond
        max_loras, or whose grammar is still compiling, waits (in place) while later
        ones may go ahead."""
        skipped: list[Request] = []
        try:
            return self._admit_waiting(budget, num_scheduled, new_reqs, cached_reqs, loras,
                                       skipped, spec_tokens)
        finally:
            self.waiting.extendleft(reversed(skipped))
            self.num_deferred_reqs = len(skipped)

    def _admit_waiting(self, budget: int, num_scheduled: dict[str, int],
                       new_reqs: list[NewRequestData], cached_reqs: list[CachedRequestData],
                       loras: set[int], skipped: list[Request],
                       spec_tokens: dict[str, list[int]]) -> int:
        while self.waiting and budget > 0 and (len(self.running) < self.max_num_seqs
                                               or self.policy == PRIORITY):
            request = self.waiting[0]
            if request.num_output_placeholders:
                # Preempted with a step in flight: resumes once its token is back.
                skipped.append(self.waiting.popleft())
                continue
            if request.status == RequestStatus.WAITING_FOR_FSM:
                if not self._grammar_ready(request):
                    if self.waiting and self.waiting[0] is request:
                        skipped.append(self.waiting.popleft())  # still compiling
                    continue
                request.status = RequestStatus.WAITING
            if not self._lora_fits(request, loras):
                skipped.append(self.waiting.popleft())
                continue
            if len(self.running) >= self.max_num_seqs:
                freed = self._preempt_for(request, num_scheduled, cached_reqs, spec_tokens)
                if freed is None:
                    break
                budget += freed
                continue
            computed_blocks, num_computed = [], 0
            if request.num_computed_tokens == 0:
                computed_blocks, num_computed = self.kv_cache_manager.get_computed_blocks(
                    request)
            num_external = self._num_external_tokens(request, num_computed)
            num_computed += num_external
            num_new = request.num_tokens - num_computed
            if not self.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            wanted = num_new
            encoder_left = self._encoder_left
            num_new, to_encode = self._fit_encoder_inputs(request, num_computed, num_new)
            if num_new <= 0 or (num_new < wanted and not self.enable_chunked_prefill):
                break
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_external + num_new, computed_blocks,
                self._lookahead(request, num_computed + num_new))
            if new_blocks is None:
                freed = self._preempt_for(request, num_scheduled, cached_reqs, spec_tokens)
                if freed is None:
                    break
                budget += freed
                self._encoder_left = encoder_left
                continue  # try again with the victim's blocks free
            if num_external:
                request.num_external_computed_tokens = num_external
                self.connector.update_state_after_alloc(
                    request, self.kv_cache_manager.get_block_ids(request.request_id),
                    num_external)
            self._book_encoder_inputs(request, to_encode)
            self.waiting.popleft()
            self._add_running(request)
            resumed = request.status == RequestStatus.PREEMPTED
            request.status = RequestStatus.RUNNING
            if request.num_computed_tokens == 0:
                self.kv_cache_manager.record_prefix_cache_lookup(
                    request, num_computed - num_external)
                if self.connector is not None and not request.wants_prompt_logprobs:
                    self.external_queries += request.num_tokens
                    self.external_hits += num_external
            request.num_computed_tokens = num_computed
            if request.num_cached_tokens < 0:
                # Local prefix-cache hits plus connector-loaded tokens, as vLLM counts.
                request.num_cached_tokens = num_computed
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            if request.lora_int_id:
                loras.add(request.lora_int_id)
            if resumed:
                cached_reqs.append(CachedRequestData(
                    req_id=request.request_id,
                    new_block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
                    new_group_block_ids=self.kv_cache_manager.get_group_block_ids(
                        request.request_id),
                    num_computed_tokens=num_computed,
                    new_token_ids=list(request.output_token_ids),
                    num_tokens=request.num_tokens, resumed_from_preemption=True))
                continue
            new_reqs.append(NewRequestData(
                req_id=request.request_id,
                prompt_token_ids=request.prompt_token_ids,
                output_token_ids=list(request.output_token_ids),
                sampling_params=request.sampling_params,
                block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
                group_block_ids=self.kv_cache_manager.get_group_block_ids(request.request_id),
                num_computed_tokens=num_computed,
                wants_prompt_logprobs=request.wants_prompt_logprobs,
                lora_request=request.lora_request, pooling_params=request.pooling_params,
                mm_inputs=request.mm_features))
        return budget

    def _num_external_tokens(self, request: Request, num_local: int) -> int:
        """Prompt tokens after the `num_local` cached ones that the KV connector loads
        from another engine: asked only at a request's first admission (a preempted
        one recomputes; the remote copy may be gone), and never for prompt logprobs
        (they need every prompt position computed here)."""
        resumed = request.num_cached_tokens >= 0
        if (self.connector is None or request.num_computed_tokens != 0
                or request.wants_prompt_logprobs
                or (resumed and not getattr(self.connector, "loads_on_resume", False))):
            return 0
        num_external, _ = self.connector.get_num_new_matched_tokens(request, num_local)
        return num_external

    def _fit_encoder_inputs(self, request: Request, start: int, num_new: int
                            ) -> tuple[int, list]:
        """(tokens that fit this step's encoder budget and cache, images to encode)."""
        if not request.mm_features:
            return num_new, []
        num_new, to_encode, self._encoder_left = schedule_encoder_inputs(
            self.encoder_cache_manager, request.request_id, request.mm_features, start,
            num_new, self._encoder_left,
            whole_images=self.whole_images)
        return num_new, to_encode

    def _book_encoder_inputs(self, request: Request, to_encode: list) -> None:
        """The request's images in this chunk: cached ones it now uses, new ones
        allocated (the runner encodes them this step)."""
        if not request.mm_features:
            return
        manager = self.encoder_cache_manager
        for feature in request.mm_features:
            if manager.is_cached(feature.identifier):
                manager.use(request.request_id, feature.identifier)
        for feature in to_encode:
            if not manager.is_cached(feature.identifier):
                manager.allocate(request.request_id, feature.identifier, feature.length)

    def _grammar_ready(self, request: Request) -> bool:
        """Whether the request's grammar is compiled; a failed compile ends the request
        with the reason as its error (a 400 for the client)."""
        try:
            return self.structured_output_manager.grammar_ready(request)
        except Exception as e:  # noqa: BLE001 - one request's grammar, not the engine
            logger.error("Structured output grammar of request %s failed to compile: %s",
                         request.request_id, e)
            error = f"The structured output constraint could not be used: {e}"
        self.waiting.popleft()
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request)
        self._failed_outputs.append(EngineCoreOutput(
            request_id=request.request_id, new_token_ids=[],
            finish_reason=request.get_finished_reason(), error=error))
        return False

    def take_failed_outputs(self) -> list[EngineCoreOutput]:
        outputs, self._failed_outputs = self._failed_outputs, []
        return outputs

    def wait_for_grammars(self, timeout: float) -> None:
        """Nothing could be scheduled: wait (briefly) for a grammar compile to finish."""
        compiling = [r for r in self.waiting if r.status == RequestStatus.WAITING_FOR_FSM]
        self.structured_output_manager.wait_for_compiles(compiling, timeout)

    # ------------------------------------------------------------- update
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        outputs: list[EngineCoreOutput] = self._fail_kv_loads(runner_output)
        outputs += self._fail_requests(runner_output)
        for i, req_id in enumerate(runner_output.req_ids):
            request = self.requests.get(req_id)
            if request is None:
                continue  # aborted while the step ran (or its KV load failed)
            new_ids = runner_output.sampled_token_ids[i]
            if self.async_scheduling:
                request.num_output_placeholders -= len(new_ids)  # booked when scheduled
            else:
                request.num_computed_tokens += scheduler_output.num_scheduled_tokens[req_id]
            if req_id in runner_output.pooler_output:
                outputs.append(self._finish_pooling(request, runner_output.pooler_output[req_id]))
                continue
            self._account_drafts(request, scheduler_output, new_ids)
            prompt_lp = runner_output.prompt_logprobs.get(req_id)
            if prompt_lp is not None and request.num_computed_tokens >= request.num_prompt_tokens:
                request.prompt_logprobs_done = True
            if not new_ids and prompt_lp is None:
                continue  # a prefill chunk that produced nothing to report
            if new_ids:
                new_ids = self._append_until_stop(request, new_ids)
                request.spec_token_ids = runner_output.spec_token_ids.get(req_id, [])
            logprobs = runner_output.logprobs[i] if runner_output.logprobs else None
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=new_ids,
                new_logprobs=logprobs[:len(new_ids)] if (logprobs and new_ids) else None,
                new_prompt_logprobs=prompt_lp,
                finish_reason=request.get_finished_reason(), stop_reason=request.stop_reason,
                num_cached_tokens=max(request.num_cached_tokens, 0),
                num_preemptions=request.num_preemptions,
                num_external_computed_tokens=request.num_external_computed_tokens))
            if request.is_finished():
                # Async scheduling: a request preempted after this step was scheduled
                # sits in the waiting queue.
                (self.running if request in self.running else self.waiting).remove(request)
                outputs[-1].kv_transfer_params = self._free_request(request)
        return outputs

    def _fail_kv_loads(self, runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """End the requests whose KV the connector could not load (finish reason
        "error"): the step computed them on a cache without their prompt. Their blocks
        leave the prefix cache before they are freed."""
        kv_out = runner_output.kv_connector_output
        if kv_out is None or not kv_out.failed_recving:
            return []
        on_failed = getattr(self.connector, "on_failed_loads", None)
        if on_failed is not None:  # KV offloading: those host blocks are not to be reused
            on_failed(kv_out.failed_recving)
        outputs = []
        for req_id in sorted(kv_out.failed_recving):
            request = self.requests.get(req_id)
            if request is None:
                continue
            local = max(request.num_cached_tokens, 0) - request.num_external_computed_tokens
            self.kv_cache_manager.forget_blocks(
                request, local, local + request.num_external_computed_tokens)
            (self.running if request in self.running else self.waiting).remove(request)
            request.status = RequestStatus.FINISHED_ERROR
            self._free_request(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=[], finish_reason=request.get_finished_reason(),
                num_cached_tokens=local, num_preemptions=request.num_preemptions))
        return outputs

    def _fail_requests(self, runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """End the requests the runner failed (finish reason "error", no token): one
        request's failure in the runner (a custom logits processor) ends only it."""
        outputs = []
        for req_id, reason in sorted(runner_output.failed_req_ids.items()):
            request = self.requests.get(req_id)
            if request is None:
                continue
            logger.error("Request %s failed in the model runner: %s", req_id, reason)
            (self.running if request in self.running else self.waiting).remove(request)
            request.status = RequestStatus.FINISHED_ERROR
            self._free_request(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=[], finish_reason=request.get_finished_reason(),
                num_cached_tokens=max(request.num_cached_tokens, 0),
                num_preemptions=request.num_preemptions))
        return outputs

    def _finish_pooling(self, request: Request, pooled: Any) -> EngineCoreOutput:
        """A pooling request ends with the step that computed its prompt."""
        request.status = RequestStatus.FINISHED_STOPPED
        self.running.remove(request)
        self._free_request(request)
        return EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                finish_reason=request.get_finished_reason(),
                                num_cached_tokens=max(request.num_cached_tokens, 0),
                                pooling_output=pooled)

    def _account_drafts(self, request: Request, so: SchedulerOutput,
                        new_ids: list[int]) -> None:
        """Rejected drafts' KV is not the request's: take them out of its computed
        tokens (their slots are overwritten by the next step's tokens); count the
        acceptance."""
        drafts = so.scheduled_spec_decode_tokens.get(request.request_id)
        if not drafts or not new_ids:
            return
        num_accepted = len(new_ids) - 1
        request.num_computed_tokens -= len(drafts) - num_accepted
        self.spec_decoding_stats.observe_draft(len(drafts), num_accepted)

    def _append_until_stop(self, request: Request, new_ids: list[int]) -> list[int]:
        """Append the step's tokens one at a time (grammar, then stop checks), stopping
        at the first that ends the request (EOS, stop token, length, grammar): tokens
        after it (accepted drafts) are dropped. Returns the appended ones."""
        for n, token_id in enumerate(new_ids, 1):
            request.append_output_token_ids([token_id])
            self._advance_grammar(request, [token_id])
            if not request.is_finished():
                self._check_stop(request)
            if request.is_finished():
                return new_ids[:n]
        return new_ids

    def _advance_grammar(self, request: Request, new_ids: list[int]) -> None:
        """Feed accepted tokens to the request's grammar (a rejected one ends it)."""
        if not request.use_structured_output:
            return
        manager = self.structured_output_manager
        if not manager.accept_tokens(request, new_ids):
            logger.error("Request %s: token(s) %s rejected by its grammar; aborting it.",
                         request.request_id, new_ids)
            request.status = RequestStatus.FINISHED_ABORTED
        elif manager.is_terminated(request) and (
                new_ids[-1] == request.eos_token_id
                or new_ids[-1] in request.sampling_params.stop_token_ids):
            # The grammar is complete and took its stop token: done even with ignore_eos.
            request.status = RequestStatus.FINISHED_STOPPED

    def _check_stop(self, request: Request) -> None:
        params = request.sampling_params
        last = request.output_token_ids[-1]
        if request.num_output_tokens >= params.min_tokens:
            if last == request.eos_token_id and not params.ignore_eos:
                request.status = RequestStatus.FINISHED_STOPPED
                return
            if params.stop_token_ids and last in params.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = last
                return
        if (request.num_output_tokens >= request.max_tokens
                or request.num_tokens >= self.max_model_len):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED

    def get_stats(self) -> SchedulerStats:
        pc = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage, prefix_cache_queries=pc.queries,
            prefix_cache_hits=pc.hits, num_preemptions=self.num_preemptions,
            num_deferred_reqs=min(self.num_deferred_reqs, len(self.waiting)),
            running_lora_adapters=_count_loras(self.running),
            waiting_lora_adapters=_count_loras(self.waiting),
            spec_decoding_stats=(self.spec_decoding_stats.copy()
                                 if self.spec_decoding_stats is not None else None),
            kv_cache_eviction_events=self._drain_kv_cache_events(),
            external_prefix_cache_queries=self.external_queries,
            external_prefix_cache_hits=self.external_hits,
            kv_offload=(self.connector.stats() if hasattr(self.connector, "stats")
                        else None))

    def _drain_kv_cache_events(self) -> list:
        collector = self.kv_cache_manager.block_pool.metrics_collector
        return collector.drain_events() if collector is not None else []


def _num_pending(request: Request) -> int:
    """Tokens the request still needs computed, the placeholders of steps in flight
    included (their inputs are the tokens those steps sample)."""
    return request.num_tokens + request.num_output_placeholders - request.num_computed_tokens


def _count_loras(requests: Iterable[Request]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in requests:
        if request.lora_request is not None:
            name = request.lora_request.lora_name
            counts[name] = counts.get(name, 0) + 1
    return counts
