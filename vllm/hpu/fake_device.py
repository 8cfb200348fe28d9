"""Plain-Python stand-ins for the Gaudi device calls (`htcore`, `torch.hpu`, metrics).

Off hardware the "HPU" is the CPU: there is no lazy graph to cut, nothing runs
asynchronously, and there is one device. Each function keeps the real signature so
callers are written once for both modes.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from vllm import envs
from vllm.hpu import compile_stats, memory

METRIC_NAMES = ("graph_compilation", "cpu_fallback")


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Real: flush the accumulated lazy graph. Fake: ops already ran eagerly."""
    return None


def is_lazy() -> bool:
    """Lazy mode is what PT_HPU_LAZY_MODE=1 selects (the runner may use HPU graphs)."""
    return envs.PT_HPU_LAZY_MODE == 1


def synchronize() -> None:
    """Real: wait for the device. Fake: CPU ops are synchronous."""
    return None


def set_device(device: Any = 0) -> None:
    """The fake device has exactly one card, index 0."""
    index = device if isinstance(device, int) else getattr(device, "index", 0) or 0
    if index != 0:
        raise ValueError(f"the fake HPU has one device (index 0), got {device!r}.")


def device_count() -> int:
    return 1


def mem_get_info() -> tuple[int, int]:
    """(free, total): VLLM_FAKE_HPU_MEMORY_GB minus what `memory.track_alloc` holds."""
    return memory.fake_mem_get_info()


class FakeMetric:
    """What `metric_localcontext` yields: `stats()` -> [(name, value), ...] like Gaudi's.

    graph_compilation: [("TotalNumber", compiles), ("TotalTime", ms), ("AvgTime", ms)],
    counting `compile_stats.record_compile` calls with new signatures inside the block.
    cpu_fallback: [("TotalNumber", 0), ("FallbackOps", {})]; nothing falls back off
    hardware because everything already runs on the CPU.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._start_count = compile_stats.compile_count()
        self._start_time = time.perf_counter()
        self._end: tuple[int, float] | None = None

    def _close(self) -> None:
        self._end = (compile_stats.compile_count(), time.perf_counter())

    def stats(self) -> list[tuple[str, Any]]:
        count, now = self._end or (compile_stats.compile_count(), time.perf_counter())
        if self.name == "cpu_fallback":
            return [("TotalNumber", 0), ("FallbackOps", {})]
        compiles = count - self._start_count
        total_ms = (now - self._start_time) * 1000.0 if compiles else 0.0
        return [("TotalNumber", compiles), ("TotalTime", total_ms),
                ("AvgTime", total_ms / compiles if compiles else 0.0)]


@contextlib.contextmanager
def metric_localcontext(metric_name: str) -> Iterator[FakeMetric]:
    """Measure a metric over the `with` block."""
    if metric_name not in METRIC_NAMES:
        raise ValueError(f"metric_name must be one of {METRIC_NAMES}, got {metric_name!r}.")
    metric = FakeMetric(metric_name)
    try:
        yield metric
    finally:
        metric._close()
