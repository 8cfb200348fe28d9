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
A choice made on unsteady timings (a busy machine) is cached with its quality (how
far apart its two best samples were) and the number of starts that tried: later
starts use it and time again only until `MAX_TRIES` starts have tried, keeping the
steadiest choice seen, and only when the machine is not busy at that start (load average
per usable CPU at most 1), so a busy machine does not make starts re-time kernels.
`VLLM_CPU_RETUNE=1` times everything again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

import torch

from vllm import envs

logger = logging.getLogger(__name__)

T = TypeVar("T")

NOISE = 1.3
"""The two fastest samples of a kind must agree within this factor to be steady."""
MAX_TRIES = 3
"""Starts that time an unsteady choice again before it is kept as it is."""


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


_serving_threads: list[int] = []


@contextlib.contextmanager
def serving_threads(threads: int) -> Iterator[None]:
    """Time kernels with `threads` threads inside this block, whatever the calling
    thread's own count: the CPU runner packs weights (and so times the GEMM plans) on one
    thread (cpu_model_runner._no_thread_team), but serves with all of them, and a plan
    timed single-threaded can pick another kernel than the engine would."""
    _serving_threads.append(threads)
    try:
        yield
    finally:
        _serving_threads.pop()


def timing_threads() -> int:
    """The thread count kernel timings run with (and are cached under)."""
    return _serving_threads[-1] if _serving_threads else torch.get_num_threads()


def cache_path(folder: str, prefix: str, parts: Sequence[str]) -> Path:
    """`$VLLM_CACHE_ROOT/<folder>/<prefix>-<digest>.json`, the digest over the CPU model,
    timing thread count, torch version and `parts` (kernel sources, candidates, buckets)."""
    key = "|".join([cpu_model(), str(timing_threads()), torch.__version__, *parts])
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
    `NOISE`: on a loaded machine they do not (see `CachedChoice`)."""
    return all(v[1] <= v[0] * NOISE for v in samples.values() if len(v) > 1)


def noise_of(samples: Sequence[dict[str, list[float]]]) -> float:
    """The worst ratio between the two fastest samples of a kind (1.0: perfectly steady)."""
    ratios = [v[1] / v[0] for m in samples for v in m.values() if len(v) > 1 and v[0] > 0]
    return max(ratios, default=1.0)


@dataclass(frozen=True)
class CachedChoice:
    """One cached plan: the kernels, how noisy the timings behind them were, and how
    many starts have timed it."""
    kinds: tuple[str, ...]
    steady: bool
    noise: float = 1.0
    tries: int = 1

    @classmethod
    def from_json(cls, value: Any) -> Optional["CachedChoice"]:
        """An entry of the cache file (a bare list: a steady choice of older caches)."""
        if isinstance(value, list):
            return cls(tuple(value), True)
        if isinstance(value, dict) and isinstance(value.get("kinds"), list):
            return cls(tuple(value["kinds"]), bool(value.get("steady")),
                       float(value.get("noise", 1.0)), int(value.get("tries", 1)))
        return None

    def to_json(self) -> Any:
        if self.steady:
            return list(self.kinds)
        return {"kinds": list(self.kinds), "steady": False, "noise": round(self.noise, 3),
                "tries": self.tries}

    def needs_timing(self) -> bool:
        """Time again at this start: asked for, or unsteady, not yet tried enough, and
        the machine is not busy now (timings on a busy machine would be unsteady again:
        the start keeps the cached choice and leaves the retry to a quieter one)."""
        if envs.VLLM_CPU_RETUNE:
            return True
        return not self.steady and self.tries < MAX_TRIES and not machine_busy()


def machine_busy() -> bool:
    """More runnable work than this process's CPUs over the last minute (load average
    per usable CPU above 1)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: assume quiet
        return False
    return load > len(os.sched_getaffinity(0))


def keep_best(old: Optional[CachedChoice], kinds: Sequence[str],
              samples: Sequence[dict[str, list[float]]]) -> CachedChoice:
    """The choice to cache after a timing: the new one, unless an older unsteady one was
    steadier; a steady timing always wins."""
    new = CachedChoice(tuple(kinds), all(stable(m) for m in samples), noise_of(samples))
    if old is None or new.steady or old.steady:
        return new if (old is None or new.steady or not old.steady) else old
    best = new if new.noise <= old.noise else old
    return CachedChoice(best.kinds, False, best.noise, old.tries + 1)


def measure_off_thread(measure: Callable[[], T], name: str) -> T:
    """`measure()` on a short-lived thread, in inference mode, with `timing_threads()`
    threads; its exception is raised here.

    The engine is built on one thread precisely so that the building thread owns no
    OpenMP thread team (see cpu_model_runner._no_thread_team); a team belongs to the
    thread that starts it and ends with it, so timing there leaves no team behind.
    """
    result: list[T] = []
    errors: list[BaseException] = []
    threads, caller_threads = timing_threads(), torch.get_num_threads()

    def target() -> None:
        torch.set_num_threads(threads)  # the engine's count (serving_threads)
        try:
            with torch.inference_mode():
                result.append(measure())
        except Exception as e:  # reported on the calling thread
            errors.append(e)
        finally:
            torch.set_num_threads(caller_threads)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
