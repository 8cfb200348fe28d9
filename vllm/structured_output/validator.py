"""The frontend's check of a request's grammar: parsed by its backend, under bounds.

Parsing is what catches a bad schema, regex or grammar with a 400 that names the
field, before the request is queued (as vLLM does). It is not always cheap: a JSON
schema pattern such as `[a-z]{1,9999}` expands into seconds of grammar rules, so a
schema of a thousand of them parses for hours. So the parse runs in a helper process
under the compile limits (vllm/structured_output/compile_pool.py, kind "validate"),
and its verdict is cached by spec: the server checks a request's constraint off the
event loop, and the engine's own check of the same request (Processor) finds the
verdict cached. One validator serves a process.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import threading
from collections import OrderedDict
from typing import Optional

from vllm.structured_output.backend_types import GrammarSpec
from vllm.structured_output.compile_pool import CompilerSetup, GrammarCompilePool
from vllm.structured_output.limits import GrammarLimits

VERDICT_CACHE_SIZE = 1024
"""Specs whose verdict is kept (the least recently used go first)."""


class GrammarValidator:

    def __init__(self, limits: GrammarLimits, workers: int) -> None:
        self.limits = limits
        self.pool = GrammarCompilePool(limits, workers, None, self._setup, kind="validate")
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[tuple[str, GrammarSpec], concurrent.futures.Future] = \
            OrderedDict()

    def _setup(self) -> CompilerSetup:
        return CompilerSetup(tokenizer="", tokenizer_mode="auto", vocab_size=0,
                             stop_token_ids=(), xgrammar_tokenizer_info=None,
                             max_memory_bytes=self.limits.compile_max_memory_mb << 20,
                             max_seconds=self.limits.compile_timeout_s)

    def check(self, backend: str, spec: GrammarSpec, trusted: bool = False) -> None:
        """Return if the spec parses within the limits; ValueError saying why not."""
        key = (backend, spec)
        with self._lock:
            future = self._verdicts.get(key)
            if future is None:
                future = self.pool.submit(backend, spec, trusted=trusted)
                self._verdicts[key] = future
                while len(self._verdicts) > VERDICT_CACHE_SIZE:
                    self._verdicts.popitem(last=False)
            else:
                self._verdicts.move_to_end(key)
        future.result()  # re-raises the ValueError

    def shutdown(self) -> None:
        self.pool.shutdown()


_validator: Optional[GrammarValidator] = None
_validator_lock = threading.Lock()


def get_validator() -> GrammarValidator:
    """This process's validator (its helper starts on the first untrusted spec)."""
    global _validator
    with _validator_lock:
        if _validator is None:
            import vllm.envs as envs
            _validator = GrammarValidator(GrammarLimits.from_env(),
                                          envs.VLLM_STRUCTURED_OUTPUT_COMPILE_WORKERS)
            atexit.register(_validator.shutdown)
        return _validator
