"""The CPU forward's thread team follows the free cores (vllm/cpu/threads.py)."""
from __future__ import annotations

import gc

import pytest
import torch

from vllm.cpu import threads as cpu_threads
from vllm.cpu.threads import (DELAY_CORES, START_HOLD, CpuSample, ProcReader,
                                     ThreadGovernor)


class Machine:
    """Cumulative counters of a scripted machine, one second per sample."""

    def __init__(self) -> None:
        self.wall = self.own_cpu = self.own_delay = self.busy = 0.0

    def second(self, own: float, delay: float, others: float) -> CpuSample:
        self.wall += 1.0
        self.own_cpu += own
        self.own_delay += delay
        self.busy += own + others
        return CpuSample(self.wall, self.own_cpu, self.own_delay, self.busy)


def _governor(max_threads: int = 2) -> tuple[ThreadGovernor, list[int]]:
    calls: list[int] = []
    gov = ThreadGovernor(max_threads, sample=lambda: None, set_threads=calls.append)
    return gov, calls


def test_idle_machine_keeps_every_thread():
    gov, calls = _governor()
    m = Machine()
    for _ in range(20):
        gov.observe(m.second(own=1.95, delay=0.07, others=0.05))
    assert gov.threads == 2 and calls == []


def test_a_busy_neighbour_takes_a_thread_and_its_departure_gives_it_back():
    gov, calls = _governor()
    m = Machine()
    gov.observe(m.second(own=1.9, delay=0.05, others=0.05))
    gov.observe(m.second(own=0.65, delay=1.3, others=1.0))  # a hog arrived
    assert gov.threads == 1 and calls == [1]
    for _ in range(10):  # the hog keeps its core: no room to grow
        gov.observe(m.second(own=1.0, delay=0.02, others=1.0))
    assert gov.threads == 1
    for i in range(START_HOLD):  # it left: a whole core is free for `hold` samples
        assert gov.threads == 1
        gov.observe(m.second(own=1.0, delay=0.0, others=0.02))
    assert gov.threads == 2 and calls == [1, 2]


def test_a_neighbour_that_comes_and_goes_backs_off():
    gov, calls = _governor()
    m = Machine()
    gov.observe(m.second(own=1.9, delay=0.0, others=0.0))
    holds = []
    for _ in range(3):
        gov.observe(m.second(own=0.7, delay=1.0, others=1.0))   # contended: drop
        while gov.threads == 1:                                 # free: wait `hold`, grow
            gov.observe(m.second(own=1.0, delay=0.0, others=0.0))
        holds.append(gov.hold)
        gov.observe(m.second(own=0.7, delay=1.0, others=1.0))   # contended right away
    assert gov.hold > START_HOLD and holds == sorted(holds)
    assert calls.count(1) == 4


def test_delay_below_the_threshold_is_not_contention():
    gov, calls = _governor(max_threads=4)
    m = Machine()
    for _ in range(10):
        gov.observe(m.second(own=3.9, delay=DELAY_CORES * 0.8, others=0.1))
    assert gov.threads == 4 and calls == []


def test_proc_reader_reads_this_process():
    reader = ProcReader()
    if not reader.available:
        pytest.skip("no /proc on this system")
    first = reader.sample()
    sum(i * i for i in range(200000))
    second = reader.sample()
    assert second.own_cpu > first.own_cpu and second.machine_busy >= first.machine_busy
    assert second.own_delay >= first.own_delay >= 0


def test_off_by_env_and_in_batch_invariant_mode(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setenv("VLLM_CPU_ADAPTIVE_THREADS", "0")
    assert cpu_threads.make_governor() is None
    monkeypatch.setenv("VLLM_CPU_ADAPTIVE_THREADS", "1")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert cpu_threads.make_governor() is None
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert cpu_threads.make_governor() is not None


def test_engine_resizes_its_forward_team_under_contention(monkeypatch, tiny_model_factory):
    """A scripted contended machine: the runner drops to one thread on the forward's
    thread, then grows back, and the greedy tokens equal a fixed-team run."""
    from vllm import LLM, SamplingParams
    path = tiny_model_factory("llama")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5 + i, 17, 33 + i, 2]} for i in range(4)]

    def generate() -> list:
        llm = LLM(model=path, dtype="float32", max_model_len=256)
        try:
            return [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                    use_tqdm=False)]
        finally:
            llm.llm_engine.shutdown()
            del llm
            gc.collect()

    monkeypatch.setenv("VLLM_CPU_ADAPTIVE_THREADS", "0")
    reference = generate()

    m = Machine()
    script = iter([(1.9, 0.0, 0.0), (0.6, 1.2, 1.0)] + [(1.0, 0.0, 0.0)] * 1000)
    resized: list[int] = []
    real_set, threads = torch.set_num_threads, torch.get_num_threads()

    def recording_set(n: int) -> None:
        resized.append(n)
        real_set(n)

    monkeypatch.setenv("VLLM_CPU_ADAPTIVE_THREADS", "1")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(ProcReader, "sample", lambda self: m.second(*next(script)))
    monkeypatch.setattr(cpu_threads.ThreadGovernor.__init__, "__defaults__",
                        (0.0, None, recording_set))
    try:
        assert generate() == reference
    finally:
        real_set(threads)
    assert resized[:2] == [1, 2]


def test_the_frontend_parent_counts_as_our_own(tmp_path):
    """A child's reader adds its parent's CPU time to its own (the parent here: this test
    process, which burns CPU while the child samples)."""
    import subprocess
    import sys
    import os
    code = ("import os, time; from vllm.cpu.threads import ProcReader\n"
            "r = ProcReader(frontend_pid=os.getppid()); a = r.sample(); time.sleep(0.5)\n"
            "b = r.sample(); print(b.own_cpu - a.own_cpu)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=env)
    while child.poll() is None:
        sum(i * i for i in range(20000))
    grown = float(child.stdout.read())
    if not ProcReader().available:
        pytest.skip("no /proc on this system")
    # The parent's busy half second (a share of it on a loaded machine), not the
    # child's sleep, which costs it almost nothing.
    assert grown > 0.05


def test_a_background_helper_thread_waiting_is_not_contention():
    """Nice 19 threads of our own (the KV cache's background commit) that compute while
    the forward has the cores wait for a CPU by design: their wait must not count."""
    import hashlib
    import os
    import threading
    import time
    reader = ProcReader()
    if not reader.available or not hasattr(os, "setpriority"):
        pytest.skip("no /proc on this system")
    stop = threading.Event()
    data = bytes(1 << 20)

    def helper():  # hashing a large buffer runs without the GIL
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while not stop.is_set():
            hashlib.sha256(data).digest()

    threads = [threading.Thread(target=helper) for _ in range(2 * (os.cpu_count() or 1))]
    for t in threads:
        t.start()
    try:
        a = reader.sample()
        end = time.monotonic() + 0.6
        while time.monotonic() < end:  # the "forward": nice 0, on a core of its own
            hashlib.sha256(data).digest()
        b = reader.sample()
    finally:
        stop.set()
        for t in threads:
            t.join()
    # The helpers waited for about (helpers - cores) cores meanwhile; none of it counts.
    assert (b.own_delay - a.own_delay) / (b.wall - a.wall) < DELAY_CORES
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert cpu_threads._thread_nice(str(threading.get_native_id())) == own
