"""Acceptance counters of speculative decoding, their Prometheus series and log line.

The scheduler counts (`SpecDecodingStats`, cumulative, in `SchedulerStats`); the
serving stats tracker turns the growth into vLLM's counters
`vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
`vllm:spec_decode_num_accepted_tokens` and `vllm:spec_decode_num_accepted_tokens_per_pos`
(label `position`), and logs the acceptance rate with the periodic stats line.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

logger = logging.getLogger(__name__)


@dataclass
class SpecDecodingStats:
    """Cumulative since the engine started."""
    num_spec_tokens: int
    """k: positions per draft (the length of `num_accepted_tokens_per_pos`)."""
    num_drafts: int = 0
    """Verification steps of requests that had drafts."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    """How often the draft at position i was accepted."""

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    def copy(self) -> "SpecDecodingStats":
        return SpecDecodingStats(self.num_spec_tokens, self.num_drafts, self.num_draft_tokens,
                                 self.num_accepted_tokens,
                                 list(self.num_accepted_tokens_per_pos))

    def minus(self, older: Optional["SpecDecodingStats"]) -> "SpecDecodingStats":
        """The counts since `older` (None: since the start)."""
        if older is None:
            return self.copy()
        return SpecDecodingStats(
            self.num_spec_tokens, self.num_drafts - older.num_drafts,
            self.num_draft_tokens - older.num_draft_tokens,
            self.num_accepted_tokens - older.num_accepted_tokens,
            [a - b for a, b in zip(self.num_accepted_tokens_per_pos,
                                   older.num_accepted_tokens_per_pos)])

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def log_line(self) -> str:
        """vLLM's SpecDecoding log wording, for the counts of one interval."""
        mean_len = 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
        per_pos = ", ".join(f"{n / self.num_drafts:.3f}" if self.num_drafts else "0.000"
                            for n in self.num_accepted_tokens_per_pos)
        return (f"SpecDecoding metrics: Mean acceptance length: {mean_len:.2f}, "
                f"Accepted: {self.num_accepted_tokens} tokens, Drafted: "
                f"{self.num_draft_tokens} tokens, Per-position acceptance rate: {per_pos}, "
                f"Avg Draft acceptance rate: {100 * self.acceptance_rate:.1f}%")


class SpecDecodingProm:
    """vLLM's spec-decode counters in a stats tracker's registry."""

    def __init__(self, registry: Any, labels: list[str], values: tuple[str, ...],
                 num_spec_tokens: int) -> None:
        from prometheus_client import Counter

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=registry).labels(*values)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                        "Number of draft tokens.")
        self.num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens",
                                           "Number of accepted tokens.")
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                          "Accepted tokens per draft position.", [*labels, "position"],
                          registry=registry)
        self.per_pos = [per_pos.labels(*values, str(i)) for i in range(num_spec_tokens)]
        self._last: Optional[SpecDecodingStats] = None
        self._last_logged: Optional[SpecDecodingStats] = None

    def observe(self, stats: SpecDecodingStats) -> None:
        """Advance the counters to the scheduler's cumulative `stats`."""
        delta = stats.minus(self._last)
        self.num_drafts.inc(max(delta.num_drafts, 0))
        self.num_draft_tokens.inc(max(delta.num_draft_tokens, 0))
        self.num_accepted_tokens.inc(max(delta.num_accepted_tokens, 0))
        for counter, n in zip(self.per_pos, delta.num_accepted_tokens_per_pos):
            counter.inc(max(n, 0))
        self._last = stats.copy()

    def log(self) -> None:
        """Log the acceptance of the interval since the last call (if any drafts)."""
        if self._last is None:
            return
        delta = self._last.minus(self._last_logged)
        self._last_logged = self._last.copy()
        if delta.num_drafts:
            logger.info(delta.log_line())
