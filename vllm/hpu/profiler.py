"""VLLM_PROFILER_ENABLED: a high-level trace of the HPU runner's work.

Each forward pass, warmup phase and sampling call becomes one complete event
("ph": "X") in Chrome's trace-event JSON, with its bucket in the arguments, so a
run can be opened in Perfetto or chrome://tracing to see where padding, compiles
and host overhead go. The file `vllm_hpu_trace_<pid>.json` is written in the
working directory when the worker shuts down (and at interpreter exit). While a
torch profile runs (start_profile, VLLM_TORCH_PROFILER_DIR) the same phases are
named ranges of the torch trace, whether or not this trace is enabled.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
from typing import Any, Iterator, Optional

import torch

from vllm import envs

logger = logging.getLogger(__name__)


class HPUProfiler:
    """Collects trace events when enabled; every method is a no-op otherwise."""

    def __init__(self, enabled: Optional[bool] = None, path: Optional[str] = None) -> None:
        self.enabled = envs.VLLM_PROFILER_ENABLED if enabled is None else enabled
        self.path = path or os.path.join(os.getcwd(), f"vllm_hpu_trace_{os.getpid()}.json")
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._origin = time.perf_counter()
        if self.enabled:
            atexit.register(self.flush)
            logger.info("VLLM_PROFILER_ENABLED: writing a trace to %s at shutdown.", self.path)

    @contextlib.contextmanager
    def record(self, name: str, **args: Any) -> Iterator[None]:
        """One event; also a named range in a running torch profile (start_profile, see
        torch_profiler.py), so the torch trace shows the runner's phases and buckets."""
        if torch.autograd._profiler_enabled():
            label = " ".join([name, *(f"{k}={v}" for k, v in args.items())])
            with torch.profiler.record_function(label):
                with self._record(name, **args):
                    yield
            return
        with self._record(name, **args):
            yield

    @contextlib.contextmanager
    def _record(self, name: str, **args: Any) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            event = {"name": name, "ph": "X", "pid": os.getpid(),
                     "tid": threading.get_ident(), "ts": (start - self._origin) * 1e6,
                     "dur": (end - start) * 1e6, "args": args}
            with self._lock:
                self._events.append(event)

    @property
    def num_events(self) -> int:
        return len(self._events)

    def flush(self) -> Optional[str]:
        """Write every event so far; returns the path (None when disabled or empty)."""
        if not self.enabled or not self._events:
            return None
        with self._lock:
            payload = {"traceEvents": list(self._events), "displayTimeUnit": "ms"}
        with open(self.path, "w") as f:
            json.dump(payload, f)
        return self.path
