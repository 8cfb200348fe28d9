"""KV block residency for `--kv-cache-metrics`: how long sampled blocks live.

The block pool calls the collector when a block is allocated, touched again (a
prefix-cache hit takes it back) and evicted (its cached content is dropped to reuse the
block). For a sampled block, an eviction yields one `KVCacheEvictionEvent`: its lifetime
(allocation -> eviction), its idle time (last access -> eviction) and the gaps between its
accesses. The events travel in `SchedulerStats` to the frontend, which observes vLLM's
histograms (vllm:kv_block_lifetime_seconds, ...). Sampling keeps the cost to a dict
lookup per block event; off (no collector) it is one `is None` test.
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

MAX_RECORDED_ACCESSES = 4
"""Access times kept per sampled block (a ring): its last reuse gaps, as vLLM."""


@dataclass
class KVCacheEvictionEvent:
    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: list[float] = field(default_factory=list)


@dataclass
class _BlockTimes:
    birth: float
    accesses: deque = field(default_factory=lambda: deque(maxlen=MAX_RECORDED_ACCESSES))


class KVCacheMetricsCollector:

    def __init__(self, sample_rate: float = 0.01, seed: int | None = None) -> None:
        self.sample_rate = sample_rate
        self._rng = random.Random(seed)
        self._tracked: dict[int, _BlockTimes] = {}
        self._events: list[KVCacheEvictionEvent] = []

    def on_block_allocated(self, block_id: int) -> None:
        if self.sample_rate >= 1.0 or self._rng.random() < self.sample_rate:
            now = time.monotonic()
            times = _BlockTimes(birth=now)
            times.accesses.append(now)
            self._tracked[block_id] = times
        else:
            self._tracked.pop(block_id, None)

    def on_block_accessed(self, block_id: int) -> None:
        times = self._tracked.get(block_id)
        if times is not None:
            times.accesses.append(time.monotonic())

    def on_block_evicted(self, block_id: int) -> None:
        times = self._tracked.pop(block_id, None)
        if times is None:
            return
        now = time.monotonic()
        accesses = list(times.accesses)
        self._events.append(KVCacheEvictionEvent(
            lifetime_seconds=now - times.birth, idle_seconds=now - accesses[-1],
            reuse_gaps_seconds=[b - a for a, b in zip(accesses, accesses[1:])]))

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        """The evictions since the last call (each reported once)."""
        events, self._events = self._events, []
        return events
