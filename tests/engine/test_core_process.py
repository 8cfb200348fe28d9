"""The engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1): the same tokens
as in-process, admin calls and their errors across the boundary, a start-up failure
raised in the frontend, a killed core reported (not a hang), no orphan when the frontend
is killed."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from vllm import LLM, SamplingParams
from vllm.engine.core_client import EngineCoreDeadError, MPEngineCoreClient

PROMPTS = [f"Request {i}: the story of the number {i} begins with" for i in range(6)]


def _params() -> list[SamplingParams]:
    greedy = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
              for _ in range(4)]
    seeded = [SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=24, n=2,
                             ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=24, stop=[" the"], logprobs=2)]
    return greedy + seeded


def _run(llm: LLM) -> list[tuple]:
    outs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    return [[(c.token_ids, c.text, c.finish_reason) for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def tiny(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


def _llm(model: str, **kw) -> LLM:
    return LLM(model=model, dtype="float32", max_model_len=256, **kw)


@pytest.fixture(scope="module")
def mp_llm(tiny):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    try:
        llm = _llm(tiny, enable_sleep_mode=True)
    finally:
        del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    yield llm
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


def test_out_of_process_equals_in_process(tiny, mp_llm):
    assert isinstance(mp_llm.llm_engine.engine_core, MPEngineCoreClient)
    core_pid = mp_llm.llm_engine.engine_core.proc.pid
    assert core_pid != os.getpid()
    inproc = _llm(tiny)
    try:
        expected = _run(inproc)
    finally:
        inproc.llm_engine.shutdown()
    assert _run(mp_llm) == expected
    # The scheduler's stats came across with the outputs.
    assert mp_llm.llm_engine.get_stats().prefix_cache_queries > 0


def test_admin_calls_cross_the_process_boundary(mp_llm):
    core_pid = mp_llm.llm_engine.engine_core.proc.pid
    assert mp_llm.collective_rpc(lambda worker: os.getpid()) == [core_pid]
    assert mp_llm.reset_prefix_cache() is True
    with pytest.raises(ValueError, match="level"):
        mp_llm.sleep(level=3)  # the core's ValueError, raised again here
    mp_llm.sleep(level=1)
    with pytest.raises(ValueError, match="sleeping"):
        mp_llm.generate("x", SamplingParams(max_tokens=2), use_tqdm=False)
    mp_llm.wake_up()
    out = mp_llm.generate("x", SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    with pytest.raises(AttributeError, match="another process"):
        mp_llm.llm_engine.model_executor


def test_start_up_failure_is_raised_in_the_frontend(tiny, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(MemoryError, match="The KV cache needs"):
        LLM(model=tiny, dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 44)
    time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and "resource_tracker" not in
            " ".join(p.cmdline())]
    assert not left, left


def test_killed_core_is_reported_not_a_hang(tiny, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = _llm(tiny)
    client = llm.llm_engine.engine_core
    os.kill(client.proc.pid, signal.SIGKILL)
    # At once: not only once the kernel has torn the process down and it can be reaped.
    with pytest.raises(EngineCoreDeadError, match=r"\(killed by SIGKILL\)\.$"):
        llm.llm_engine.check_health()
    start = time.monotonic()
    with pytest.raises(EngineCoreDeadError):
        llm.generate(PROMPTS, SamplingParams(max_tokens=8), use_tqdm=False)
    assert time.monotonic() - start < 5
    llm.llm_engine.shutdown()


def test_no_orphan_when_the_frontend_is_killed(tiny):
    """SIGKILL of the frontend process: its core process notices (death pipe) and exits."""
    script = textwrap.dedent(f"""
        import os, sys, time
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        from vllm import LLM
        llm = LLM(model={tiny!r}, dtype="float32", max_model_len=256)
        print("CORE", llm.llm_engine.engine_core.proc.pid, flush=True)
        time.sleep(600)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    proc.stdin.write(script)
    proc.stdin.close()
    try:
        core_pid = None
        deadline = time.monotonic() + 180
        while core_pid is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("CORE"):
                core_pid = int(line.split()[1])
            elif not line and proc.poll() is not None:
                break
        assert core_pid is not None, "the script never started its core"
        core = psutil.Process(core_pid)
        proc.kill()
        proc.wait(10)
        core.wait(10)  # psutil.TimeoutExpired: an orphan
    finally:
        proc.kill()


def test_fake_hpu_core_out_of_process_with_preemption(tiny, monkeypatch):
    """The fake HPU's engine core in its own process, with a KV pool small enough to
    preempt: the tokens of the in-process engine."""
    from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env
    prompts = [f"Request number {i} tells a story about" for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    results, compiles = [], []
    for multiprocess in ("0", "1"):
        with platform_env("hpu", **SMALL_BUCKETS):
            monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocess)
            llm = make_llm(model=tiny, max_num_seqs=8, block_size=16, max_model_len=256,
                           num_gpu_blocks_override=24, enable_prefix_caching=False)
            try:
                results.append([o.outputs[0].token_ids
                                for o in llm.generate(prompts, params, use_tqdm=False)])
                assert llm.llm_engine.get_stats().num_preemptions > 0
                compiles.append(llm.llm_engine.get_compile_stats()["num_compiles_after_warmup"])
            finally:
                llm.llm_engine.shutdown()
    assert results[0] == results[1]
    # Not compared: the compile counts. Out of process the core may start stepping before
    # the last request arrives, so the batches (and the cold shapes a preempted prompt's
    # recompute reaches in this tiny pool, 4-7 here) differ.
    print(f"\ncompiles after warmup (in, out of process): {compiles}")


def test_unguarded_script_gets_a_clear_error(tiny, tmp_path):
    """A script file without the `if __name__ == "__main__":` guard: spawn re-imports it
    in the core process, which fails; the frontend says why instead of hanging. (Spawn
    asked for: a script that ran no torch op gets a forked core, which re-imports
    nothing; see vllm/engine/core_launch.py.)"""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        import os
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        from vllm import LLM
        LLM(model={tiny!r}, dtype="float32", max_model_len=256)
    """))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               VLLM_WORKER_MULTIPROC_METHOD="spawn")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode != 0
    assert 'guard its top level with `if __name__ == "__main__":`' in out.stderr, \
        out.stderr[-3000:]
