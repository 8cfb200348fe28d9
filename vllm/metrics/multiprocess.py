"""Metrics shared by several API server processes (--api-server-count N), as vLLM does:
prometheus_client's multiprocess mode, where every process writes its series to files
in PROMETHEUS_MULTIPROC_DIR and /metrics, in any of them, reads them all.

Counters and histograms add up over the processes: each request is counted by the one
API server that served it. Gauges keep the most recent value written by any process
(GAUGE_MODE): a core's queue gauges are written by that core's primary frontend only
(vllm/engine/core_server.py), the info gauges hold the same value everywhere.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

GAUGE_MODE = "mostrecent"
"""Every gauge's multiprocess_mode (ignored outside multiprocess mode)."""

ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's own variable: set before it is imported in a process."""


def enabled() -> bool:
    from vllm import envs
    return bool(envs.PROMETHEUS_MULTIPROC_DIR)


def setup_dir() -> Optional[str]:
    """A fresh directory for this deployment's files, exported to the API servers this
    process starts (None when the user gave one: it is theirs to clear)."""
    if enabled():
        return None
    path = tempfile.mkdtemp(prefix="vllm-metrics-")
    os.environ[ENV] = path
    return path


def remove_dir(path: Optional[str]) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(ENV, None)


def render_all() -> bytes:
    """Every API server's engine and HTTP series, merged."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return generate_latest(registry)


def mark_process_dead(pid: int) -> None:
    from prometheus_client import multiprocess
    multiprocess.mark_process_dead(pid)
