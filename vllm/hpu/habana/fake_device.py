"""Plain-Python stand-ins for the Gaudi device calls (`htcore`, `torch.hpu`, metrics).

Off hardware the "HPU" is the CPU: there is no lazy graph to cut and nothing runs
asynchronously. The node has VLLM_FAKE_HPU_DEVICE_COUNT devices; like the real
runtime, a process works on one of them, chosen by `set_device` (default 0), and
`current_device()` tells which, so tests can check that ranks and data-parallel
replicas pick distinct devices (each device can have its own memory size, see
memory.py). `mark_step()` calls are counted (`mark_step_count()`), so tests can check
that the graph is cut where lazy mode needs it. Each function keeps the real
signature so callers are written once for both modes.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch

from vllm import envs
from vllm.hpu.habana import compile_stats, memory

METRIC_NAMES = ("graph_compilation", "cpu_fallback")


_mark_steps = 0
_current_device = 0


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Real: flush the accumulated lazy graph. Fake: ops already ran eagerly; counted."""
    global _mark_steps
    _mark_steps += 1


def mark_step_count() -> int:
    """How many times `mark_step` was called in this process (fake HPU only)."""
    return _mark_steps


def is_lazy() -> bool:
    """Lazy mode is what PT_HPU_LAZY_MODE=1 selects (the runner may use HPU graphs)."""
    return envs.PT_HPU_LAZY_MODE == 1


def synchronize() -> None:
    """Real: wait for the device. Fake: CPU ops are synchronous."""
    return None


def set_device(device: Any = 0) -> None:
    """Work on device `device` (an index, or a torch.device; "hpu" without an index
    means device 0) from now on in this process."""
    global _current_device
    if isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index or 0
    if not 0 <= index < device_count():
        raise ValueError(f"the fake HPU has {device_count()} devices "
                         f"(VLLM_FAKE_HPU_DEVICE_COUNT), got device {device!r}.")
    _current_device = index


def current_device() -> int:
    return _current_device


def device_count() -> int:
    return envs.VLLM_FAKE_HPU_DEVICE_COUNT


def mem_get_info() -> tuple[int, int]:
    """(free, total) of the current device: its VLLM_FAKE_HPU_MEMORY_GB minus what
    `memory.track_alloc` holds."""
    return memory.fake_mem_get_info(_current_device)


class FakeMetric:
    """What `metric_localcontext` yields: `stats()` -> [(name, value), ...] like Gaudi's.

    graph_compilation: [("TotalNumber", compiles), ("TotalTime", ms), ("AvgTime", ms)],
    counting `compile_stats.record_compile` calls with new signatures inside the block.
    cpu_fallback: [("TotalNumber", None), ("FallbackOps", {})]: not measurable. A CPU
    fallback is an op without a Gaudi kernel run on the host; off hardware every op
    runs on the host and nothing says which would lack a kernel, so the count is
    unknown (None), not 0.
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
            return [("TotalNumber", None), ("FallbackOps", {})]
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
