"""Tokenization for the server: off the event loop, on a few threads, with bounded inputs.

One tokenizer thread made one long prompt everybody's problem: every string prompt queued
behind it. Here several threads share the work, each with its own tokenizer copy (a fast
tokenizer's truncation/padding state is per object), and the encoder releases the GIL, so
the event loop and the engine thread keep running. Inputs are bounded before encoding
(`max_prompt_chars`): no prompt of more characters can fit in max_model_len tokens.
"""
from __future__ import annotations

import asyncio
import copy
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

MAX_WORKERS = 4


def max_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token stands for: the longest vocabulary entry.

    A byte-level or sentencepiece token spells at most as many characters as its vocabulary
    string has symbols, so a text of more than max_model_len * this characters cannot fit.
    """
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary: a generous bound
        return 256
    return max(16, max((len(token) for token in vocab), default=16))


class TokenizerPool:
    """Runs tokenizer work on `workers` threads; each thread encodes with its own copy."""

    def __init__(self, tokenizer: Any, workers: Optional[int] = None) -> None:
        self.tokenizer = tokenizer
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.workers = workers or max(2, min(MAX_WORKERS, cores))
        self.chars_per_token = max_token_chars(tokenizer)
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(max_workers=self.workers,
                                            thread_name_prefix="vllm-tokenizer")

    def max_prompt_chars(self, max_tokens: int) -> int:
        """More characters than this cannot tokenize to `max_tokens` tokens or fewer."""
        return max_tokens * self.chars_per_token

    def _own_tokenizer(self) -> Any:
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            try:
                tokenizer = copy.deepcopy(self.tokenizer)
            except Exception:  # noqa: BLE001 - encoding without truncation is read-only
                tokenizer = self.tokenizer
            self._local.tokenizer = tokenizer
        return tokenizer

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on a pool thread (not the event loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        def work() -> list[int]:
            encoded = self._own_tokenizer()(text, add_special_tokens=add_special_tokens)
            return list(encoded["input_ids"])

        return await self.run(work)

    async def encode_many(self, texts: list[str], add_special_tokens: bool
                          ) -> list[list[int]]:
        """Token ids of each text, in one job: a request's batch of prompts costs one
        hand-off to a pool thread, not one per prompt (a thousand hand-offs took longer
        than the encoding), and a fast tokenizer encodes the batch in parallel."""
        if not texts:
            return []

        def work() -> list[list[int]]:
            encoded = self._own_tokenizer()(texts, add_special_tokens=add_special_tokens)
            return [list(ids) for ids in encoded["input_ids"]]

        return await self.run(work)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
