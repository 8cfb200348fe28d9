"""What the CPU's start-up kernel choices share: timing on a fresh thread, a test for
steady timings, and one cache of the plans they chose.

Two choices are made by measurement when an engine starts, because the fastest
kernel depends on the CPU (a plan tuned on one machine is a regression on another):
the GEMM kernel per weight shape and row count (gemm_autotune.py) and the prefill
attention kernel per length (prefill_choice.py). Both time candidates interleaved and
take the minimum (load from other processes only ever adds time), both run on a
short-lived thread, and both keep what they chose in a JSON file under
`$VLLM_CACHE_ROOT`, named by a digest of the CPU model, thread count, torch version
and what else the timings depend on, so only a machine's first start pays for them.
A choice made on unsteady timings (a busy machine) is used but not cached.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import torch

from vllm import envs

logger = logging.getLogger(__name__)

T = TypeVar("T")

NOISE = 1.3
"""The two fastest samples of a kind must agree within this factor to be steady."""


def cpu_model() -> str:
    """`model name` of /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def cache_path(folder: str, prefix: str, parts: Sequence[str]) -> Path:
    """`$VLLM_CACHE_ROOT/<folder>/<prefix>-<digest>.json`, the digest over the CPU model,
    thread count, torch version and `parts` (kernel sources, candidates, buckets)."""
    key = "|".join([cpu_model(), str(torch.get_num_threads()), torch.__version__, *parts])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(envs.VLLM_CACHE_ROOT) / folder / f"{prefix}-{digest}.json"


def load(path: Path) -> dict:
    """The cached plans ({} when missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def store(path: Path, plans: dict) -> None:
    """Write atomically; a read-only cache costs a re-measurement, nothing else."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(plans, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        logger.debug("Could not write the kernel plan cache %s: %s", path, e)


def stable(samples: dict[str, list[float]]) -> bool:
    """Whether the two fastest samples (sorted lists) of every kind agree within
    `NOISE`: on a loaded machine they do not, and such a choice is not cached."""
    return all(v[1] <= v[0] * NOISE for v in samples.values() if len(v) > 1)


def measure_off_thread(measure: Callable[[], T], name: str) -> T:
    """`measure()` on a short-lived thread, in inference mode, with the process's
    thread count; its exception is raised here.

    The engine is built on one thread precisely so that the building thread owns no
    OpenMP thread team (see cpu_model_runner._no_thread_team); a team belongs to the
    thread that starts it and ends with it, so timing there leaves no team behind.
    """
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            with torch.inference_mode():
                result.append(measure())
        except Exception as e:  # reported on the calling thread
            errors.append(e)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
