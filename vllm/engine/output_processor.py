"""Output processing: token ids from the core -> text, stop strings, RequestOutput.

Each core request has a RequestState holding its incremental detokenizer and the
logprobs gathered so far. A request with n > 1 is n core requests ("children")
under one ParentRequest; the user sees one RequestOutput with n completions.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

import torch

from vllm.core.scheduler import EngineCoreOutput
from vllm.engine.detokenizer import IncrementalDetokenizer, decode_token_text
from vllm.engine.logprobs_utils import make_logprob_dict
from vllm.engine.stop_checker import check_stop_strings
from vllm.outputs import (CompletionOutput, PoolingOutput, PoolingRequestOutput,
                          RequestMetrics, RequestOutput)
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.sequence import Logprob, PromptLogprobs, SampleLogprobs

if TYPE_CHECKING:
    from vllm.tracing import RequestTracer


@dataclass
class RequestFailure:
    """A request the engine ended with an error instead of output (its grammar could
    not be compiled). The async engine raises `error` as a ValueError in the request's
    stream (a 400 on the server); LLM raises it."""
    request_id: str
    error: str
    finished: bool = True


@dataclass
class ParentRequest:
    """The user's request: owns n children and the parts of the output they share."""
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    children: list["RequestState"] = field(default_factory=list)
    prompt_logprobs: Optional[PromptLogprobs] = None
    num_cached_tokens: int = 0
    num_external_computed_tokens: int = 0
    kv_transfer_params: Optional[dict] = None
    trace_headers: Optional[dict[str, str]] = None
    """The client's W3C trace context (traceparent, tracestate): the parent of the
    request's span when tracing is on."""

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.children)


@dataclass
class RequestState:
    request_id: str
    index: int
    parent: ParentRequest
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: Optional[SampleLogprobs] = None
    cumulative_logprob: Optional[float] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[int | str] = None
    sent_text_len: int = 0
    sent_tokens: int = 0
    sent_logprobs: int = 0
    sent_finished: bool = False
    text: str = ""


class OutputProcessor:

    def __init__(self, tokenizer, tracer: Optional["RequestTracer"] = None) -> None:
        self.tokenizer = tokenizer
        self.tracer = tracer
        """Emits each finished request's span (--otlp-traces-endpoint); None: off."""
        self.request_states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}
        self.pooling_requests: dict[str, list[int]] = {}
        """Pooling requests in flight -> their prompt token ids (one output each)."""
        # Without a tokenizer (skip_tokenizer_init) logprobs carry no decoded tokens.
        self._decode = None if tokenizer is None else (
            lambda token_id: decode_token_text(tokenizer, token_id))

    # ---------------------------------------------------------- bookkeeping
    def add_request(self, parent: ParentRequest, child_ids: list[str],
                    child_params: list[SamplingParams]) -> None:
        self.parents[parent.request_id] = parent
        for i, (cid, params) in enumerate(zip(child_ids, child_params)):
            state = RequestState(
                request_id=cid, index=i, parent=parent, params=params,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer, parent.prompt_token_ids,
                    skip_special_tokens=params.skip_special_tokens,
                    spaces_between_special_tokens=params.spaces_between_special_tokens),
                logprobs=[] if params.logprobs is not None else None,
                cumulative_logprob=0.0 if params.logprobs is not None else None)
            parent.children.append(state)
            self.request_states[cid] = state
        if parent.params.prompt_logprobs is not None:
            parent.prompt_logprobs = [None]

    def add_pooling_request(self, request_id: str, prompt_token_ids: list[int]) -> None:
        self.pooling_requests[request_id] = prompt_token_ids

    def abort_requests(self, parent_ids) -> list[str]:
        """Forget parents; return their children's core ids (to abort in the core)."""
        child_ids = []
        for pid in parent_ids:
            if self.pooling_requests.pop(pid, None) is not None:
                child_ids.append(pid)
                continue
            parent = self.parents.pop(pid, None)
            if parent is None:
                continue
            for child in parent.children:
                self.request_states.pop(child.request_id, None)
                child_ids.append(child.request_id)
        return child_ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents or self.pooling_requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.parents) + len(self.pooling_requests)

    # ------------------------------------------------------------- process
    def process_outputs(self, outputs: list[EngineCoreOutput]
                        ) -> tuple[list[RequestOutput], list[str]]:
        """-> (outputs for the user, core request ids stopped by a stop string)."""
        now = time.time()
        touched: dict[str, ParentRequest] = {}
        stopped: list[str] = []
        results: list = []
        for out in outputs:
            if out.request_id in self.pooling_requests:
                results.append(self._pooling_output(out))
                continue
            state = self.request_states.get(out.request_id)
            if state is None:
                continue
            parent = state.parent
            self._update_metrics(parent, out, now)
            if out.new_prompt_logprobs is not None and parent.prompt_logprobs is not None:
                parent.prompt_logprobs.extend(self._prompt_logprob_dicts(
                    out.new_prompt_logprobs))
            if out.error is not None:
                results.append(RequestFailure(parent.request_id, out.error))
                touched.pop(parent.request_id, None)
                stopped.extend(cid for cid in self.abort_requests([parent.request_id])
                               if cid != out.request_id)
                continue
            if out.new_token_ids:
                if self._process_tokens(state, out):
                    stopped.append(state.request_id)
            elif out.finish_reason is not None:  # ended without a token (KV load failed)
                state.finish_reason, state.stop_reason = out.finish_reason, out.stop_reason
            touched[parent.request_id] = parent
        for parent in touched.values():
            result = self._make_request_output(parent)
            if result is not None:
                results.append(result)
            if parent.finished:
                if self.tracer is not None:
                    self.tracer.trace_request(parent)
                self.abort_requests([parent.request_id])
        return results, stopped

    def _pooling_output(self, out: EngineCoreOutput) -> PoolingRequestOutput:
        """A pooling request's one output (an abort gives an empty vector)."""
        prompt_ids = self.pooling_requests.pop(out.request_id)
        data = out.pooling_output
        if data is None:
            data = torch.empty(0)
        return PoolingRequestOutput(request_id=out.request_id, outputs=PoolingOutput(data),
                                    prompt_token_ids=prompt_ids,
                                    num_cached_tokens=out.num_cached_tokens, finished=True)

    @staticmethod
    def _update_metrics(parent: ParentRequest, out: EngineCoreOutput, now: float) -> None:
        m = parent.metrics
        if m.first_scheduled_time is None:
            m.first_scheduled_time = now
            m.time_in_queue = now - m.arrival_time
        parent.num_cached_tokens = out.num_cached_tokens
        parent.num_external_computed_tokens = out.num_external_computed_tokens
        if out.kv_transfer_params is not None:
            parent.kv_transfer_params = out.kv_transfer_params
        m.num_preemptions = max(m.num_preemptions, out.num_preemptions)
        if out.new_token_ids:
            if m.first_token_time is None:
                m.first_token_time = now
            m.last_token_time = now

    def _process_tokens(self, state: RequestState, out: EngineCoreOutput) -> bool:
        """Detokenize, check stop strings; True if a stop string ended the request.

        Several tokens in one step (speculative decoding) are taken one at a time when
        stop strings are set, so tokens after the one completing a stop string are
        dropped, as without speculation."""
        if len(out.new_token_ids) > 1 and state.params.stop and state.params.detokenize:
            return any(self._process_tokens(state, part) for part in _per_token(out))
        params = state.params
        new_ids = out.new_token_ids
        state.token_ids.extend(new_ids)
        if state.logprobs is not None and out.new_logprobs:
            for ids, lps, rank in out.new_logprobs:
                state.logprobs.append(self._logprob_dict(ids, lps, rank))
                state.cumulative_logprob += lps[0]
        # The core only stops on tokens (EOS / stop_token_ids); such a token adds no text.
        stop_token = out.finish_reason == "stop" and not params.include_stop_str_in_output
        text_ids = new_ids[:-1] if stop_token else new_ids
        if params.detokenize:
            delta = state.detokenizer.update(text_ids) if text_ids else ""
            if out.finish_reason is not None:
                delta += state.detokenizer.flush()
            state.text += delta
        if out.finish_reason is not None:
            state.finish_reason, state.stop_reason = out.finish_reason, out.stop_reason
            return False
        if params.stop and params.detokenize and len(state.token_ids) > params.min_tokens:
            hit = check_stop_strings(state.text, len(delta), params.stop,
                                     params.include_stop_str_in_output)
            if hit is not None:
                stop_str, truncate_to = hit
                state.text = state.text[:truncate_to]
                state.finish_reason, state.stop_reason = "stop", stop_str
                return True
        return False

    def _logprob_dict(self, ids: list[int], lps: list[float], rank: int) -> dict[int, Logprob]:
        return make_logprob_dict(ids, lps, rank, len(ids) - 1, self._decode)

    def _prompt_logprob_dicts(self, chunk) -> list[dict[int, Logprob]]:
        ids_rows, lp_rows, ranks = chunk
        return [self._logprob_dict(ids, lps, rank)
                for ids, lps, rank in zip(ids_rows, lp_rows, ranks)]

    # ------------------------------------------------------------- outputs
    def _make_request_output(self, parent: ParentRequest) -> Optional[RequestOutput]:
        kind = parent.params.output_kind
        finished = parent.finished
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if finished:
            parent.metrics.finished_time = time.time()
        delta = kind == RequestOutputKind.DELTA
        completions = []
        for child in parent.children:
            comp = self._completion(child, delta)
            if comp is not None:
                completions.append(comp)
        if delta and not completions:
            return None
        return RequestOutput(
            request_id=parent.request_id, prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids, prompt_logprobs=parent.prompt_logprobs,
            outputs=completions, finished=finished, metrics=parent.metrics,
            num_cached_tokens=parent.num_cached_tokens,
            kv_transfer_params=parent.kv_transfer_params if finished else None,
            num_external_computed_tokens=parent.num_external_computed_tokens)

    @staticmethod
    def _visible_text_len(child: RequestState) -> int:
        """How much of `child.text` may be shown to the user now.

        While the request runs, the last `output_text_buffer_length` characters (the
        longest stop string minus one) are held back: they may be the beginning of a
        stop string that the next tokens complete, and once sent they cannot be taken
        back. Both the offline and the served paths read text only through here.
        """
        if child.finish_reason is not None:
            return len(child.text)
        held = child.params.output_text_buffer_length
        return max(child.sent_text_len, len(child.text) - held)

    @classmethod
    def _completion(cls, child: RequestState, delta: bool) -> Optional[CompletionOutput]:
        """Everything so far, or (delta mode) what is new since the last output."""
        visible = cls._visible_text_len(child)
        if not delta:
            text, ids, lps = child.text[:visible], list(child.token_ids), child.logprobs
        else:
            has_new = len(child.token_ids) > child.sent_tokens
            newly_finished = child.finish_reason is not None and not child.sent_finished
            if not (has_new or newly_finished):
                return None
            text = child.text[child.sent_text_len:visible]
            ids = child.token_ids[child.sent_tokens:]
            lps = child.logprobs[child.sent_logprobs:] if child.logprobs is not None else None
            child.sent_text_len = visible
            child.sent_tokens = len(child.token_ids)
            child.sent_logprobs = len(child.logprobs) if child.logprobs is not None else 0
            child.sent_finished = child.finish_reason is not None
        return CompletionOutput(
            index=child.index, text=text, token_ids=ids,
            cumulative_logprob=child.cumulative_logprob, logprobs=lps,
            finish_reason=child.finish_reason, stop_reason=child.stop_reason)


def _per_token(out: EngineCoreOutput) -> Iterator[EngineCoreOutput]:
    """`out` as one output per new token (the finish reason on the last)."""
    last = len(out.new_token_ids) - 1
    for i, token_id in enumerate(out.new_token_ids):
        yield dataclasses.replace(
            out, new_token_ids=[token_id],
            new_logprobs=out.new_logprobs[i:i + 1] if out.new_logprobs else None,
            finish_reason=out.finish_reason if i == last else None,
            stop_reason=out.stop_reason if i == last else None)
