"""A scripted stand-in for LLMEngine, for fault injection in AsyncLLMEngine/server tests.

It honours the LLMEngine contract the async engine relies on (add_request validation,
DELTA outputs, abort, stats) and can be told to crash in `step()`, which the real engine
cannot be made to do from outside. Generation is deterministic: completion j of a request
emits the token ids of FAKE_TEXT in order, shifted by j.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterable, Optional

from vllm.core.scheduler import SchedulerStats
from vllm.engine.params import RequestParamsPolicy
from vllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams

FAKE_TEXT = " one two three four five six seven eight nine ten eleven twelve"


@dataclass
class _Req:
    request_id: str
    prompt: Optional[str]
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    arrival: float
    generated: list[list[int]] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # tokens already emitted per completion


class FakeLLMEngine:
    """Deterministic engine; `fail_after_steps` makes step() raise after that many steps."""

    def __init__(self, tokenizer: Any, max_model_len: int = 256,
                 step_delay_s: float = 0.002) -> None:
        self.tokenizer = tokenizer
        self.model_config = SimpleNamespace(
            model="fake-model", served_model_name=["fake-model"], max_model_len=max_model_len,
            hf_config=SimpleNamespace(vocab_size=len(tokenizer)), max_logprobs=20,
            torch_dtype="float32", model_path="", generation_config="vllm",
            vocab_size=len(tokenizer), get_diff_sampling_param=dict,
            try_get_generation_config=dict)
        self.vllm_config = None
        self.params_policy = RequestParamsPolicy(
            max_model_len=max_model_len, vocab_size=len(tokenizer), max_logprobs=20)
        self.script = tokenizer.encode(FAKE_TEXT, add_special_tokens=False)
        self.requests: dict[str, _Req] = {}
        self.step_delay_s = step_delay_s
        self.fail_after_steps: Optional[int] = None
        self.steps = 0
        self.aborted: list[str] = []
        self.shutdown_called = False
        self.step_thread: Optional[threading.Thread] = None

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams,
                    arrival_time: Optional[float] = None) -> list[Any]:
        if request_id in self.requests:
            raise ValueError(f"Request id {request_id} is already in use.")
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
        # The engine's own rules for params (defaults, checks, max_tokens).
        params, max_tokens = self.params_policy.process(ids, params, None)
        req = self.requests[request_id] = _Req(
            request_id, text, ids, params, max_tokens, arrival_time or time.time(),
            [[] for _ in range(params.n)], [0] * params.n)
        return [req]  # as LLMEngine: the queued requests, resolved max_tokens included

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.aborted.append(rid)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_running_reqs=len(self.requests),
                              kv_cache_usage=min(1.0, 0.01 * len(self.requests)))

    def step(self) -> list[RequestOutput]:
        self.step_thread = threading.current_thread()
        self.steps += 1
        if self.fail_after_steps is not None and self.steps > self.fail_after_steps:
            raise RuntimeError("injected engine failure")
        time.sleep(self.step_delay_s)
        outputs = []
        for req in list(self.requests.values()):
            for j, tokens in enumerate(req.generated):
                tokens.append(self.script[(len(tokens) + j) % len(self.script)])
            finished = len(req.generated[0]) >= req.max_tokens
            outputs.append(self._output(req, finished))
            if finished:
                del self.requests[req.request_id]
        return outputs

    def _output(self, req: _Req, finished: bool) -> RequestOutput:
        completions = []
        delta = req.params.output_kind == RequestOutputKind.DELTA
        for j, tokens in enumerate(req.generated):
            start = req.sent[j] if delta else 0
            new = tokens[start:]
            req.sent[j] = len(tokens)
            completions.append(CompletionOutput(
                index=j, text=self.tokenizer.decode(new), token_ids=list(new),
                cumulative_logprob=None, logprobs=None,
                finish_reason="length" if finished else None))
        return RequestOutput(req.request_id, req.prompt, req.prompt_ids, None, completions,
                             finished, RequestMetrics(arrival_time=req.arrival))

    def shutdown(self) -> None:
        self.shutdown_called = True
