"""Grammar compiles bounded in time and memory, and cancelled with their requests.

A compile that never ends or eats the machine's memory cannot be stopped in a thread,
so each new spec is first compiled in a helper process (compile_helper.py) that is
killed past the time limit, past the memory limit (its resident growth, polled), or
when every request waiting for it has gone. Only a spec that compiled there within
the limits is compiled again in the engine, where it costs what the helper measured.
That doubles the CPU of each new spec (compiles are cached, and the common ones take
tens of milliseconds), for a guarantee a thread cannot give.

Fairness: `workers` compiles run at once (one helper each); when more wait, the
smallest spec goes first, so one client's huge schema delays nobody's small one for
longer than a worker is busy. Specs the engine writes itself (`trusted`, e.g.
json_object's `{"type": "object"}`) skip the helper and the queue.
"""
from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from vllm.structured_output.backend_types import GrammarSpec
from vllm.structured_output.limits import GrammarLimits
from vllm.utils.helper_process import HelperProcess, rss_bytes

logger = logging.getLogger(__name__)

_HELPER_MODULE = "vllm.structured_output.compile_helper"
_READY_TIMEOUT_S = 120.0
"""How long a compile waits for a helper that is starting (python, xgrammar, torch)."""
_POLL_S = 0.02
"""How often a running compile's memory and cancellation are checked."""


@dataclass(frozen=True)
class CompilerSetup:
    """What a helper needs to build the engine's backends."""
    tokenizer: str
    tokenizer_mode: str
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    xgrammar_tokenizer_info: Optional[str]
    """xgrammar's TokenizerInfo as JSON (rebuilding it from the tokenizer takes seconds)."""
    max_memory_bytes: int
    """The parent's memory limit; the helper caps its address space well above it as a
    backstop for growth faster than the parent's polling."""
    max_seconds: float
    """The parent's time limit; the helper caps each job's CPU time above it, so a
    compile ends even if the parent that watches it died."""


@dataclass(eq=False)
class CompileJob:
    backend: str
    spec: GrammarSpec
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    waiters: int = 1
    """Requests waiting for this compile; at 0 a queued or probing compile stops."""
    in_engine: bool = False
    """Past the helper: compiling in the engine (runs to the end and is cached)."""
    cancelled: bool = False

    @property
    def size(self) -> int:
        return len(self.spec.spec)


class GrammarCompilePool:
    """Worker threads, each driving one helper process; jobs smallest first."""

    def __init__(self, limits: GrammarLimits, workers: int,
                 compile_fn: Optional[Callable[[str, GrammarSpec], Any]],
                 helper_setup: Callable[[], CompilerSetup], kind: str = "compile") -> None:
        """`compile_fn(backend, spec)`: the engine's own compile, run once the helper's
        fit the limits; None for a pool that only checks (kind "validate": the helpers
        parse specs, a job's result is None). `helper_setup()`: the handshake of a new
        helper (a CompilerSetup), asked for in a worker thread when the first starts."""
        if workers < 1:
            raise ValueError(f"VLLM_STRUCTURED_OUTPUT_COMPILE_WORKERS must be >= 1, got "
                             f"{workers}.")
        self.limits = limits
        self.workers = workers
        self.kind = kind
        self._compile_fn = compile_fn
        self._helper_setup = helper_setup
        self._setup: Optional[CompilerSetup] = None
        self._queue: list[tuple[int, int, CompileJob]] = []
        self._seq = itertools.count()
        self._jobs: dict[int, CompileJob] = {}  # id(future) -> job, while not done
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._helpers: list[Optional[HelperProcess]] = [None] * workers
        self._direct: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._closed = False

    # ------------------------------------------------------------ public
    def submit(self, backend: str, spec: GrammarSpec, trusted: bool = False
               ) -> concurrent.futures.Future:
        """Start compiling; the future holds the compiled grammar or a ValueError that
        names the limit it broke."""
        if trusted and self._compile_fn is None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(None)
            return done
        if trusted:
            if self._direct is None:
                self._direct = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="vllm-grammar-direct")
            return self._direct.submit(self._compile_fn, backend, spec)
        job = CompileJob(backend, spec)
        with self._cond:
            self._start_threads()
            self._jobs[id(job.future)] = job
            heapq.heappush(self._queue, (job.size, next(self._seq), job))
            self._cond.notify()
        return job.future

    def add_waiter(self, future: concurrent.futures.Future) -> None:
        """Another request waits for this (cached, unfinished) compile."""
        with self._cond:
            job = self._jobs.get(id(future))
            if job is not None:
                job.waiters += 1

    def release(self, future: concurrent.futures.Future) -> bool:
        """A waiting request went away. True when that stopped the compile (no request
        waits for it any more and it had not reached the engine): forget the future."""
        with self._cond:
            job = self._jobs.get(id(future))
            if job is None or future.done():
                return False
            job.waiters -= 1
            if job.waiters > 0 or job.in_engine:
                return False
            job.cancelled = True
            del self._jobs[id(future)]
        future.cancel()  # a queued job's future is still pending: it cancels
        return True

    def helper_pids(self) -> list[int]:
        """Live helper processes (tests)."""
        return [h.pid for h in self._helpers if h is not None and h.alive]

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            for _, _, job in self._queue:
                job.future.cancel()
            self._queue.clear()
            self._cond.notify_all()
        for slot, helper in enumerate(self._helpers):
            if helper is not None:
                helper.kill()
                self._helpers[slot] = None
        if self._direct is not None:
            self._direct.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ workers
    def _start_threads(self) -> None:
        while len(self._threads) < self.workers:
            thread = threading.Thread(target=self._work, args=(len(self._threads),),
                                      name=f"vllm-grammar-{len(self._threads)}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next_job(self) -> Optional[CompileJob]:
        with self._cond:
            while True:
                while self._queue and self._queue[0][2].cancelled:
                    heapq.heappop(self._queue)
                if self._closed:
                    return None
                if self._queue:
                    return heapq.heappop(self._queue)[2]
                self._cond.wait()

    def _work(self, slot: int) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                self._run(slot, job)
            except Exception as e:  # noqa: BLE001 - fails this compile, not the engine
                logger.exception("Grammar compile failed unexpectedly.")
                self._finish(job, error=ValueError(f"the grammar could not be compiled: "
                                                   f"{type(e).__name__}: {e}"))

    def _run(self, slot: int, job: CompileJob) -> None:
        error = self._probe(slot, job)
        if job.cancelled:
            self._finish(job, error=ValueError("the request went away"))
            return
        if error is not None:
            self._finish(job, error=ValueError(error))
            return
        with self._cond:
            if job.cancelled:
                self._finish(job, error=ValueError("the request went away"))
                return
            job.in_engine = True
        if self._compile_fn is None:
            self._finish(job, result=None)
            return
        try:
            result = self._compile_fn(job.backend, job.spec)
        except ValueError as e:
            self._finish(job, error=e)
            return
        self._finish(job, result=result)

    def _finish(self, job: CompileJob, result: Any = None,
                error: Optional[BaseException] = None) -> None:
        with self._cond:
            self._jobs.pop(id(job.future), None)
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    # ------------------------------------------------------------ helpers
    def _probe(self, slot: int, job: CompileJob) -> Optional[str]:
        """Compile in the slot's helper under the limits: None if it fit, else why not."""
        helper = self._ready_helper(slot)
        if job.cancelled:
            return None
        if helper is None:
            return "the grammar compiler process could not start; see the server log."
        baseline = rss_bytes(helper.pid)
        max_growth = self.limits.compile_max_memory_mb << 20
        timeout = self.limits.compile_timeout_s

        def still_wanted() -> Optional[str]:
            if job.cancelled:
                return "cancelled"
            if rss_bytes(helper.pid) - baseline > max_growth:
                return "memory"
            return None

        helper.send((self.kind, job.backend, job.spec))
        try:
            tag, reply = helper.wait_reply(time.monotonic() + timeout, _POLL_S, still_wanted)
        except (EOFError, OSError):
            tag, reply = "died", None
        if tag == "reply" and reply[0] != "memory":
            return None if reply[0] == "ok" else reply[1]
        self._replace_helper(slot)
        what = "compiling" if self.kind == "compile" else "parsing"
        if tag == "reply" or tag == "memory":
            return (f"{what} the grammar needed more than the limit of "
                    f"{self.limits.compile_max_memory_mb} MiB of memory "
                    "(VLLM_STRUCTURED_OUTPUT_COMPILE_MAX_MEMORY_MB).")
        if tag == "timeout":
            return (f"{what} the grammar took longer than the limit of {timeout:g} s "
                    "(VLLM_STRUCTURED_OUTPUT_COMPILE_TIMEOUT_S).")
        if tag == "died":
            return (f"the grammar helper process ended while {what} the grammar; the "
                    "grammar is too large or too complex.")
        return None  # cancelled: the caller sees job.cancelled

    def _ready_helper(self, slot: int) -> Optional[HelperProcess]:
        helper = self._helpers[slot]
        if helper is None or not helper.alive:
            helper = self._helpers[slot] = self._new_helper()
        helper.loaded.wait(_READY_TIMEOUT_S)
        if not helper.alive or helper.handshake_reply != "ready":
            logger.error("A grammar compile helper process failed to start.")
            helper.kill()
            self._helpers[slot] = None
            return None
        return helper

    def _new_helper(self) -> HelperProcess:
        if self._setup is None:
            self._setup = self._helper_setup()
        return HelperProcess(_HELPER_MODULE, self._setup, "vllm-grammar-helper")

    def _replace_helper(self, slot: int) -> None:
        """Kill the slot's helper and start its successor now (it loads while idle)."""
        helper = self._helpers[slot]
        if helper is not None:
            helper.kill()
        self._helpers[slot] = None if self._closed else self._new_helper()
