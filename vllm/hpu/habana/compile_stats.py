"""Compile accounting: how many distinct graph shapes this process has compiled.

On Gaudi every new input shape costs a graph compile. The runner (and the fake HPU
graph recorder) report each shape signature they run with `record_compile`; the
count only grows for signatures never seen before. Tests and the warmup log use
`compile_count()` to show that serving after warmup compiles nothing new.

Who records what (so nothing is counted twice): a fake HPU graph records one
signature per capture; the runner records a signature only for steps it runs
without a graph (eager/lazy mode, or a bucket whose graph was not captured).
The counter is ours in both fake and real mode; on real hardware the authoritative
number is `metric_localcontext("graph_compilation")`.
"""
from __future__ import annotations

import threading
from typing import Hashable

_lock = threading.Lock()
_signatures: set[Hashable] = set()


def record_compile(signature: Hashable) -> bool:
    """Note that `signature` ran; True when it is new (i.e. it cost a compile)."""
    with _lock:
        if signature in _signatures:
            return False
        _signatures.add(signature)
        return True


def compile_count() -> int:
    """Number of distinct signatures recorded since start (or the last reset)."""
    with _lock:
        return len(_signatures)


def reset_compile_stats() -> None:
    """Forget every recorded signature (tests; a fresh engine in the same process)."""
    with _lock:
        _signatures.clear()
