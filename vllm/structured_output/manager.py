"""StructuredOutputManager: compile off the loop, cache by spec, bitmask per step."""
from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterable, Optional

import numpy as np
import torch

from vllm.config import StructuredOutputsConfig, VllmConfig
from vllm.sampling_params import StructuredOutputsParams
from vllm.structured_output.backend_types import GrammarSpec, grammar_spec
from vllm.structured_output.compile_pool import CompilerSetup, GrammarCompilePool
from vllm.structured_output.limits import GrammarLimits, check_spec_limits
from vllm.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    from vllm.request import Request

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 512
"""Compiled grammars kept (least recently used ones are dropped first)."""
TRUSTED_SPECS = frozenset({GrammarSpec("json", '{"type": "object"}', any_whitespace)
                           for any_whitespace in (True, False)})
"""Specs the engine writes itself (json_object), compiled without a helper's bounds."""


def select_backend(spec: GrammarSpec, configured: str) -> str:
    """auto: xgrammar, except for Lark grammars and whitespace patterns, which only
    llguidance reads."""
    if configured == "auto":
        guidance_only = spec.kind == "grammar_lark" or spec.whitespace_pattern is not None
        return "guidance" if guidance_only else "xgrammar"
    return configured


def validate_structured_outputs(params: StructuredOutputsParams,
                                config: StructuredOutputsConfig) -> StructuredOutputRequest:
    """Check a request's constraint without the tokenizer, in the frontend: its size
    against the limits, then its parse (bounded, in a helper process; the verdict is
    cached by spec, see validator.py).

    ValueError messages start with the field: `structured_outputs.json: invalid JSON
    schema: ...`.
    """
    from vllm.structured_output.validator import get_validator
    field = f"structured_outputs.{params.kind}"
    try:
        spec = grammar_spec(params, config.disable_any_whitespace,
                            config.disable_additional_properties)
        check_spec_limits(spec, GrammarLimits.from_env())
        backend = select_backend(spec, config.backend)
        get_validator().check(backend, spec, trusted=spec in TRUSTED_SPECS)
    except ValueError as e:
        message = str(e)
        if not message.startswith("structured_outputs"):
            message = f"{field}: {message}"
        raise ValueError(message) from None
    except RecursionError:  # parsing or writing a schema nested thousands deep
        raise ValueError(f"{field}: the schema is nested more deeply than the limit of "
                         f"{GrammarLimits.from_env().max_nesting} levels "
                         "(VLLM_STRUCTURED_OUTPUT_MAX_NESTING).") from None
    return StructuredOutputRequest(params=params, spec=spec, backend=backend)


class StructuredOutputManager:
    """Scheduler-side owner of the grammar backends, the compile pool and the cache."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        import vllm.envs as envs
        self.config = vllm_config.structured_outputs_config
        self.model_config = vllm_config.model_config
        self.vocab_size = self.model_config.vocab_size
        self.bitmask_words = (self.vocab_size + 31) // 32
        self.limits = GrammarLimits.from_env()
        self._lock = threading.Lock()
        self._backends: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._stop_token_ids: list[int] = []
        self.reasoner: Any = None
        self.pool = GrammarCompilePool(self.limits, envs.VLLM_STRUCTURED_OUTPUT_COMPILE_WORKERS,
                                       self._compile, self._helper_setup)
        self._cache: OrderedDict[tuple[str, GrammarSpec], concurrent.futures.Future] = \
            OrderedDict()

    # ------------------------------------------------------------- compile
    def grammar_init(self, request: "Request") -> None:
        """Start (or reuse) the compile of the request's grammar; never blocks."""
        so_req = request.structured_output_request
        key = (so_req.backend, so_req.spec)
        future = self._cache.get(key)
        if future is not None:
            self._cache.move_to_end(key)
            self.pool.add_waiter(future)
        else:
            future = self.pool.submit(so_req.backend, so_req.spec,
                                      trusted=so_req.spec in TRUSTED_SPECS)
            self._cache[key] = future
            while len(self._cache) > GRAMMAR_CACHE_SIZE:
                self._cache.popitem(last=False)
        so_req.compiled = future

    def release(self, request: "Request") -> None:
        """The request finished or went away: a compile nobody else waits for stops."""
        so_req = request.structured_output_request
        if so_req is None or so_req.compiled is None or so_req.compiled.done():
            return
        future = so_req.compiled
        so_req.compiled = None
        if self.pool.release(future):
            key = (so_req.backend, so_req.spec)
            if self._cache.get(key) is future:
                del self._cache[key]

    def _compile(self, backend_name: str, spec: GrammarSpec) -> Any:
        return self._backend(backend_name).compile(spec)

    def _helper_setup(self) -> CompilerSetup:
        """What a compile helper process needs to build the same backends."""
        with self._lock:
            self._load_tokenizer()
        xgrammar = self._backend("xgrammar") if self._uses_xgrammar() else None
        return CompilerSetup(
            tokenizer=self.model_config.tokenizer_path,
            tokenizer_mode=self.model_config.tokenizer_mode,
            vocab_size=self.vocab_size, stop_token_ids=tuple(self._stop_token_ids),
            xgrammar_tokenizer_info=xgrammar.tokenizer_info_json() if xgrammar else None,
            max_memory_bytes=self.limits.compile_max_memory_mb << 20,
            max_seconds=self.limits.compile_timeout_s)

    def _uses_xgrammar(self) -> bool:
        return self.config.backend in ("auto", "xgrammar")

    def _backend(self, name: str) -> Any:
        """The backend, built on first use (in a compile thread: loading the tokenizer and
        indexing its vocabulary takes about a second)."""
        with self._lock:
            backend = self._backends.get(name)
            if backend is not None:
                return backend
            self._load_tokenizer()
            if name == "xgrammar":
                from vllm.structured_output.backend_xgrammar import XgrammarBackend
                backend = XgrammarBackend(self._tokenizer, self.vocab_size,
                                          self._stop_token_ids)
            else:
                from vllm.structured_output.backend_guidance import GuidanceBackend
                backend = GuidanceBackend(self._tokenizer, self.vocab_size,
                                          self._stop_token_ids)
            self._backends[name] = backend
            logger.info("Structured outputs backend %s ready.", name)
            return backend

    def _load_tokenizer(self) -> None:
        if self._tokenizer is not None:
            return
        from vllm.transformers_utils.tokenizer import get_tokenizer
        tokenizer = get_tokenizer(self.model_config.tokenizer_path,
                                  tokenizer_mode=self.model_config.tokenizer_mode)
        stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        extra = self.model_config.try_get_generation_config().get("eos_token_id")
        for t in [extra] if isinstance(extra, int) else (extra or []):
            if t not in stops:
                stops.append(t)
        if self.config.reasoning_parser:
            from vllm.reasoning import ReasoningParserManager
            if self.config.reasoning_parser_plugin:
                # The engine may run in its own process: the user's file registers there too.
                ReasoningParserManager.import_reasoning_parser(
                    self.config.reasoning_parser_plugin)
            self.reasoner = ReasoningParserManager.get_reasoning_parser(
                self.config.reasoning_parser)(tokenizer)
        self._stop_token_ids = stops
        self._tokenizer = tokenizer

    def grammar_ready(self, request: "Request") -> bool:
        """Whether the request's matcher exists (built here once its compile is done).

        Raises ValueError when the compile failed.
        """
        so_req = request.structured_output_request
        if so_req.grammar is not None:
            return True
        if not so_req.is_compiled:
            return False
        compiled = so_req.compiled.result()  # re-raises the compile error
        so_req.grammar = self._backends[so_req.backend].new_grammar(compiled)
        if self.reasoner is not None:
            so_req.reasoning_ended = self.reasoner.reasoning_ended_in(request.all_token_ids)
        if request.output_token_ids and so_req.reasoning_ended:
            # Only a request restored with earlier output gets here; replay it.
            so_req.grammar.accept_tokens(list(request.output_token_ids))
        return True

    def wait_for_compiles(self, requests: Iterable["Request"], timeout: float) -> None:
        """Block until one of the requests' compiles finishes, at most `timeout` seconds
        (called only when nothing else can be scheduled)."""
        pending = [r.structured_output_request.compiled for r in requests
                   if r.structured_output_request is not None
                   and r.structured_output_request.compiled is not None]
        if pending:
            concurrent.futures.wait(pending, timeout=timeout,
                                    return_when=concurrent.futures.FIRST_COMPLETED)

    # ---------------------------------------------------------------- step
    def should_constrain(self, request: "Request") -> bool:
        so_req = request.structured_output_request
        return so_req is not None and so_req.grammar is not None and so_req.reasoning_ended

    def grammar_bitmask(self, requests: list["Request"],
                        spec_tokens: Optional[dict[str, list[int]]] = None
                        ) -> tuple[dict[str, int], Optional[np.ndarray]]:
        """One int32 row of allowed-token bits per constrained request about to sample;
        a request verifying k draft tokens (`spec_tokens`) gets k + 1 consecutive rows,
        row j the allowed tokens after its first j drafts (the matcher is advanced over
        them and rolled back).

        Returns ({req_id: first row}, bitmask [rows, ceil(vocab / 32)]); ({}, None)
        when no request of the step is constrained.
        """
        rows = [r for r in requests if self.should_constrain(r)]
        if not rows:
            return {}, None
        spec_tokens = spec_tokens or {}
        drafts = [spec_tokens.get(r.request_id, []) for r in rows]
        bitmask = np.full((len(rows) + sum(map(len, drafts)), self.bitmask_words), -1,
                          dtype=np.int32)
        view = torch.from_numpy(bitmask)
        first: dict[str, int] = {}
        row = 0
        for request, tokens in zip(rows, drafts):
            grammar = request.structured_output_request.grammar
            first[request.request_id] = row
            grammar.fill_bitmask(view, row)
            for token_id in tokens:
                row += 1
                if not grammar.accept_tokens([token_id]):  # validated when scheduled
                    raise RuntimeError(f"request {request.request_id}: a scheduled draft "
                                       f"token {token_id} is not allowed by its grammar")
                grammar.fill_bitmask(view, row)
            if tokens:
                grammar.rollback(len(tokens))
            row += 1
        return first, bitmask

    def valid_draft_prefix(self, request: "Request", drafts: list[int]) -> list[int]:
        """The longest prefix of `drafts` the request's grammar accepts (the matcher is
        rolled back). None of them while reasoning: the constraint's start is unknown."""
        if not self.should_constrain(request):
            return []
        grammar = request.structured_output_request.grammar
        row = torch.empty((1, self.bitmask_words), dtype=torch.int32)
        n = 0
        # Each draft is checked against the allowed-token bits first: feeding a token
        # the grammar forbids would leave some matchers (llguidance) in an error state.
        while n < len(drafts) and not grammar.is_terminated():
            grammar.fill_bitmask(row, 0)
            token_id = drafts[n]
            word = token_id // 32
            if word >= self.bitmask_words or not (int(row[0, word]) >> (token_id % 32)) & 1:
                break
            if not grammar.accept_tokens([token_id]):
                break
            n += 1
        if n:
            grammar.rollback(n)
        return drafts[:n]

    def accept_tokens(self, request: "Request", token_ids: list[int]) -> bool:
        """Advance the request's matcher over newly accepted tokens; False if rejected.

        While the model reasons the tokens are not fed to the grammar; the token that
        ends the reasoning switches the constraint on for the next one.
        """
        so_req = request.structured_output_request
        if so_req is None or so_req.grammar is None:
            return True
        if not so_req.reasoning_ended:
            if self.reasoner is not None and self.reasoner.ended_after(
                    request.output_token_ids):
                so_req.reasoning_ended = True
            return True
        return so_req.grammar.accept_tokens(token_ids)

    def is_terminated(self, request: "Request") -> bool:
        so_req = request.structured_output_request
        return bool(so_req is not None and so_req.grammar is not None
                    and so_req.reasoning_ended and so_req.grammar.is_terminated())

    def shutdown(self) -> None:
        self.pool.shutdown()
