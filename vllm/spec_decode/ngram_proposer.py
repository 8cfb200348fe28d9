"""Prompt-lookup drafts: continue the text the way it continued last time.

The longest suffix n-gram of a request's tokens (prompt_lookup_max down to
prompt_lookup_min tokens) that occurred earlier in its prompt or output is looked
up; the up to k tokens that followed that earlier occurrence are the drafts. The
most recent occurrence wins: in repetitive text (code, lists, quotes of the
prompt) it is the likeliest continuation. No model runs, so proposing is
nearly free; a request without a match gets no drafts this step.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int,
                 prompt_lookup_max: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose_batch(self, states: Sequence[Any], max_drafts: Sequence[int]
                      ) -> list[list[int]]:
        return [self.propose(st.token_ids, m) for st, m in zip(states, max_drafts)]

    def propose(self, token_ids: Sequence[int], max_drafts: int) -> list[int]:
        """Up to min(k, max_drafts) draft tokens following `token_ids` ([] if none)."""
        limit = min(self.k, max_drafts)
        num_tokens = len(token_ids)
        if limit <= 0 or num_tokens <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            start = _latest_match(tokens, n)
            if start >= 0:
                follow = tokens[start + n:start + n + limit]
                return follow.tolist()
        return []


def _latest_match(tokens: np.ndarray, n: int) -> int:
    """Start of the latest earlier occurrence of the last n tokens that is followed by
    at least one token, or -1."""
    suffix = tokens[-n:]
    windows = sliding_window_view(tokens[:-1], n)  # window i: tokens[i:i+n], i+n < len
    hits = np.flatnonzero((windows == suffix).all(axis=1))
    return int(hits[-1]) if hits.size else -1
