"""The CPU forward's thread count follows the cores actually free (issue 32, item 6).

Why: a step is a thousand small OpenMP parallel regions. libgomp's threads spin at
every barrier, which is the fastest way to run them when the team owns its cores. When
another process takes one of those cores, the team member that shares it is
descheduled for whole time slices while its peers spin, and a 2-thread step on 2 cores
was measured 3-10x slower than idle: far worse than the share of the CPU that was
lost. One thread fewer has no barrier to wait at, and degrades in proportion.

The governor samples, every `interval_s` of wall time and from the thread that runs
the forward (OpenMP's thread count is per calling thread):

- `run_delay`: the time this process's threads were runnable but waiting for a CPU
  (/proc/self/task/*/schedstat), in cores. This is the contention signal: idle it is
  a few hundredths of a core, with a busy neighbour on one of 2 cores about one core.
  Threads that run at a lower priority than the process (the KV cache's background
  commit, nice 19) are left out: they wait for the forward by design, and counting
  them made the team drop a thread to make room for its own helper.
- `others`: the CPU time the rest of the machine used on the CPUs this process may
  run on (/proc/stat minus our own), in cores: the signal that a core came back. In
  an engine-core or worker process the parent (the API server, the engine core) counts
  as our own: a server's frontend is busy whenever it streams, and waiting for it to
  go quiet would keep the team small for as long as the server is under load.

It drops one thread when `run_delay` exceeds `DELAY_CORES`, and adds one back when
`others` left a whole core free for `hold` samples in a row. A thread added back that
is dropped again within two samples doubles `hold` (up to `MAX_HOLD`), so a
neighbour that comes and goes cannot make the team flap every second.

`VLLM_CPU_ADAPTIVE_THREADS=0` keeps the configured count (it is also off in
batch-invariant mode, whose GEMMs should not change shape with the load).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

logger = logging.getLogger(__name__)

DELAY_CORES = 0.5
"""Runnable-but-waiting time (in cores) above which the team is too big for the CPU.
Serving's own API process costs the engine 0.25-0.35 cores of waiting on 2 cores, and
there two threads still win (benchmarks/README.md); a busy neighbour costs a core."""
FREE_MARGIN = 0.5
"""Cores beyond the team's own that must be idle before it grows by one."""
START_HOLD, MAX_HOLD = 2, 32


@dataclass(frozen=True)
class CpuSample:
    """Cumulative counters at one instant (seconds)."""
    wall: float
    own_cpu: float
    """This process's CPU time, and its parent's when that is our frontend."""
    own_delay: float
    machine_busy: float


def _thread_nice(tid: str) -> int:
    """Thread `tid`'s nice value (field 19 of its stat; the fields after the command,
    which may hold spaces, start at the last ")")."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


class ProcReader:
    """Reads the counters from /proc (Linux); `available` is False elsewhere."""

    def __init__(self, cpus: Optional[set[int]] = None,
                 frontend_pid: Optional[int] = None) -> None:
        if cpus is None and hasattr(os, "sched_getaffinity"):
            cpus = set(os.sched_getaffinity(0))
        self.cpus = cpus or set()
        self.frontend_pid = frontend_pid
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self.available = os.path.exists("/proc/self/task") and os.path.exists("/proc/stat")

    def sample(self) -> CpuSample:
        cpu = delay = 0
        own_nice = os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    fields = f.read().split()
                background = _thread_nice(tid) > own_nice
            except OSError:  # the thread ended between the listing and the read
                continue
            cpu += int(fields[0])
            if not background:
                delay += int(fields[1])
        own = cpu / 1e9 + self._frontend_cpu()
        return CpuSample(time.monotonic(), own, delay / 1e9, self._machine_busy())

    def _frontend_cpu(self) -> float:
        """The parent's user + system time (0 when there is none or it is gone)."""
        if self.frontend_pid is None:
            return 0.0
        try:
            with open(f"/proc/{self.frontend_pid}/stat") as f:
                # Fields after the command (which may hold spaces) start at ")".
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) * self.tick

    def _machine_busy(self) -> float:
        """Busy seconds (all but idle and iowait) summed over our CPUs."""
        busy = 0
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *values = line.split()
                if int(name[3:]) not in self.cpus:
                    continue
                counts = [int(v) for v in values[:8]]
                busy += sum(counts) - counts[3] - counts[4]
        return busy * self.tick


class ThreadGovernor:
    """Decides the forward's thread count from CPU samples (see the module docstring)."""

    def __init__(self, max_threads: int, interval_s: float = 0.5,
                 sample: Optional[Callable[[], CpuSample]] = None,
                 set_threads: Optional[Callable[[int], None]] = None) -> None:
        import torch
        self.max_threads = max_threads
        self.threads = max_threads
        self.interval_s = interval_s
        self._sample = sample or ProcReader(frontend_pid=_frontend_pid()).sample
        self._set_threads = set_threads or torch.set_num_threads
        self._last: Optional[CpuSample] = None
        self._free_streak = 0
        self.hold = START_HOLD
        self._since_raise: Optional[int] = None

    def before_step(self) -> int:
        """Call before each forward, on its thread; returns the thread count in use."""
        if self.max_threads <= 1:
            return self.threads
        now = time.monotonic()
        if self._last is not None and now - self._last.wall < self.interval_s:
            return self.threads
        self.observe(self._sample())
        return self.threads

    def observe(self, sample: CpuSample) -> None:
        """One sample: compare with the previous one and resize the team."""
        last, self._last = self._last, sample
        if last is None or sample.wall <= last.wall:
            return
        span = sample.wall - last.wall
        delay = (sample.own_delay - last.own_delay) / span
        others = max(0.0, (sample.machine_busy - last.machine_busy)
                     - (sample.own_cpu - last.own_cpu)) / span
        if self._since_raise is not None:
            self._since_raise += 1
        if delay > DELAY_CORES and self.threads > 1:
            if self._since_raise is not None and self._since_raise <= 2:
                self.hold = min(MAX_HOLD, self.hold * 2)
            self._resize(self.threads - 1, f"{delay:.2f} cores of runnable time waited "
                                           f"for a CPU")
            self._free_streak = 0
            return
        free = self.max_threads - others - self.threads
        self._free_streak = self._free_streak + 1 if free >= FREE_MARGIN else 0
        if self.threads < self.max_threads and self._free_streak >= self.hold:
            self._resize(self.threads + 1, f"{others:.2f} cores used by other processes")
            self._free_streak = 0
            self._since_raise = 0
        elif self._since_raise is not None and self._since_raise > 2 * self.hold:
            self.hold, self._since_raise = START_HOLD, None  # stable again

    def _resize(self, threads: int, why: str) -> None:
        logger.info("CPU forward threads %d -> %d (%s).", self.threads, threads, why)
        self.threads = threads
        self._set_threads(threads)


def _frontend_pid() -> Optional[int]:
    """The parent's pid when multiprocessing started this process (engine core, worker)."""
    import multiprocessing
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else None


def make_governor() -> Optional[ThreadGovernor]:
    """The governor for this process's CPU forward, or None when it is off."""
    import torch

    from vllm import envs
    if not envs.VLLM_CPU_ADAPTIVE_THREADS or envs.VLLM_BATCH_INVARIANT:
        return None
    threads = torch.get_num_threads()
    if threads <= 1 or not ProcReader().available:
        return None
    return ThreadGovernor(threads)
