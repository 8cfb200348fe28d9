"""How the engine-core process starts (vllm/engine/core_launch.py): fork or spawn as
VLLM_WORKER_MULTIPROC_METHOD says, else fork only without threads a fork would break;
a core forked early initializes from the config built just before the fork, which the
frontend's engine then runs (one initialization), serves, and never outlives its
frontend (killed, or stopped before it built its engine); an engine whose config
differs starts its own core; the server forks its core."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import psutil
import pytest

from vllm.engine import core_launch
from vllm.executor import multiproc_utils

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    return env


def test_the_env_var_is_honoured(monkeypatch):
    monkeypatch.setattr(multiproc_utils, "fork_unsafe_reason", lambda: None)
    monkeypatch.setattr(core_launch, "other_threads", lambda: 0)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert core_launch.start_method() == "spawn"
    monkeypatch.setattr(core_launch, "other_threads", lambda: 3)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    assert core_launch.start_method() == "fork"  # asked for: forks (with a warning)
    monkeypatch.setattr(multiproc_utils, "fork_unsafe_reason", lambda: "CUDA was initialized")
    assert core_launch.start_method() == "spawn"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "thread")
    with pytest.raises(ValueError, match="VLLM_WORKER_MULTIPROC_METHOD"):
        core_launch.start_method()


def test_unset_forks_only_a_process_without_other_threads(monkeypatch):
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setattr(multiproc_utils, "fork_unsafe_reason", lambda: None)
    monkeypatch.setattr(core_launch, "other_threads", lambda: 0)
    assert core_launch.start_method() == "fork"
    monkeypatch.setattr(core_launch, "other_threads", lambda: 1)
    assert core_launch.start_method() == "spawn"
    monkeypatch.setattr(core_launch, "other_threads", lambda: None)  # no /proc
    assert core_launch.start_method() == "spawn"
    monkeypatch.setattr(core_launch, "other_threads", lambda: 0)
    monkeypatch.setattr(multiproc_utils, "fork_unsafe_reason", lambda: "HPU loaded")
    assert core_launch.start_method() == "spawn"


def test_threads_are_counted_but_not_openblas_pool():
    before = core_launch.other_threads()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert core_launch.other_threads() == before + 1
    finally:
        stop.set()
        thread.join()
    # A fresh interpreter after numpy (OpenBLAS's pool) and torch: nothing to break.
    code = ("import numpy, torch; from vllm.engine import core_launch as c; "
            "print(c.other_threads(), c.start_method())")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split()[-2:] == ["0", "fork"], out.stdout + out.stderr
    # ... but after torch ran a parallel op, its OpenMP pool runs: spawn.
    code = ("import torch; x = torch.randn(512, 512); x @ x; (x + 1).sum(); "
            "from vllm.engine import core_launch as c; print(c.start_method())")
    out = subprocess.run([sys.executable, "-c", code], env=dict(_env(), OMP_NUM_THREADS="2"),
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-1:] == ["spawn"], out.stdout + out.stderr


def _script(body: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_env())
    proc.stdin.write(textwrap.dedent(body))
    proc.stdin.close()
    return proc


def _read(proc: subprocess.Popen, key: str, timeout_s: float = 240) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(key + " "):
            return line.split()[1:]
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"the script never printed {key}")


def test_early_core_serves_the_engine_and_dies_with_its_frontend(tiny_model_factory):
    tiny = tiny_model_factory("llama")
    proc = _script(f"""
        import os, sys, time
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        from vllm.engine import core_launch
        from vllm.engine.arg_utils import EngineArgs
        args = EngineArgs(model={tiny!r}, dtype="float32", max_model_len=200,
                          kv_cache_memory_bytes=16 << 20)
        assert core_launch.prestart(args)
        early = core_launch._prestarted.proc.pid
        from vllm.engine.llm_engine import LLMEngine
        engine = LLMEngine.from_engine_args(args, multiprocess=True)
        core = engine.engine_core
        print("PIDS", early, core.proc.pid, flush=True)
        print("CONFIG", engine.vllm_config.model_config.max_model_len,
              engine.vllm_config.cache_config.num_gpu_blocks, flush=True)
        time.sleep(600)
    """)
    try:
        early, core_pid = map(int, _read(proc, "PIDS"))
        assert early == core_pid  # the engine took the early core
        max_len, blocks = _read(proc, "CONFIG")
        assert int(max_len) == 200 and int(blocks) > 0  # the core's size, reported back
        core = psutil.Process(core_pid)
        proc.kill()
        proc.wait(10)
        core.wait(15)  # psutil.TimeoutExpired: an orphan
    finally:
        proc.kill()


def test_early_core_exits_when_released_or_its_frontend_stops_before_the_engine(
        tiny_model_factory):
    tiny = tiny_model_factory("llama")
    proc = _script(f"""
        from vllm.engine import core_launch
        from vllm.engine.arg_utils import EngineArgs
        args = EngineArgs(model={tiny!r}, dtype="float32", max_model_len=200,
                          kv_cache_memory_bytes=16 << 20)
        assert core_launch.prestart(args)
        untaken = core_launch._prestarted.proc
        core_launch.release()  # the engine did not take it (data parallel, say)
        untaken.join(60)
        print("RELEASED", untaken.exitcode, flush=True)
        assert core_launch.prestart(args)
        print("EARLY", core_launch._prestarted.proc.pid, flush=True)
        raise SystemExit(2)  # e.g. the port is taken
    """)
    try:
        assert _read(proc, "RELEASED") == ["0"]
        early = psutil.Process(int(_read(proc, "EARLY")[0]))
        assert proc.wait(120) == 2
        early.wait(60)
    finally:
        proc.kill()


def test_server_forks_its_core_which_dies_with_it(tiny_model_factory):
    from tests.entrypoints.conftest import RemoteServer
    model = tiny_model_factory("llama")
    srv = RemoteServer(["--model", model, "--dtype", "float32", "--max-model-len", "256",
                        "--kv-cache-memory-bytes", str(16 << 20), "--disable-log-requests"])
    try:
        reply = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        server = psutil.Process(srv.proc.pid)
        cores = [c for c in server.children() if "spawn_main" not in " ".join(c.cmdline())
                 and "resource_tracker" not in " ".join(c.cmdline())]
        assert len(cores) == 1 and cores[0].cmdline() == server.cmdline()  # forked
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)
        cores[0].wait(15)  # psutil.TimeoutExpired: an orphan
    finally:
        srv.stop()


def test_frontend_setup_failure_stops_the_started_core(tiny_model_factory, monkeypatch,
                                                       tmp_path):
    """The core process starts before the frontend loads its tokenizer (they overlap):
    a tokenizer that cannot load (a folder without one) raises here and leaves no core
    process behind."""
    from vllm import LLM
    from vllm.engine import core_client
    started = []
    real = core_client.MPEngineCoreClient._start_process
    monkeypatch.setattr(core_client.MPEngineCoreClient, "_start_process",
                        lambda self: started.append(1) or real(self))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(Exception, match="tokenizer"):
        LLM(model=tiny_model_factory("llama"), tokenizer=str(tmp_path), dtype="float32",
            max_model_len=128, kv_cache_memory_bytes=16 << 20)
    assert started  # the core had been started when the tokenizer failed
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
    _, alive = psutil.wait_procs(left, timeout=15)
    assert not alive, alive


def _early_core_run(tiny: str, server_max_len: int) -> tuple[list[str], str]:
    """A process that forks its core with the config built from max_model_len=200 (as a
    server does), then builds an `LLM` with `server_max_len`: what the core's worker
    saw, the tokens generated, and the process's log."""
    body = textwrap.dedent(f"""
        import os
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        from vllm.engine import core_launch
        from vllm.engine.arg_utils import EngineArgs
        common = dict(model={tiny!r}, dtype="float32", kv_cache_memory_bytes=16 << 20)
        assert core_launch.prestart(EngineArgs(max_model_len=200, **common))
        early = core_launch._prestarted.proc.pid
        from vllm import LLM, SamplingParams
        llm = LLM(max_model_len={server_max_len}, **common)
        seen = llm.collective_rpc(lambda w: w.vllm_config.model_config.max_model_len)
        out = llm.generate(["Hello there"], SamplingParams(max_tokens=5, temperature=0,
                                                           ignore_eos=True), use_tqdm=False)
        print("RESULT", seen[0], len(out[0].outputs[0].token_ids),
              int(llm.llm_engine.engine_core.proc.pid == early), flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", body], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300,
                         env=dict(_env(), VLLM_LOGGING_LEVEL="DEBUG"))
    assert out.returncode == 0, out.stdout[-3000:]
    result = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("RESULT")]
    return result[0], out.stdout


def test_an_engine_with_the_same_config_runs_the_early_core(tiny_model_factory):
    """`LLM(...)` fills in arguments of its own, yet builds an equal config: its engine
    runs the config the core was forked with (one initialization, no second core)."""
    (max_len, tokens, took), log = _early_core_run(tiny_model_factory("llama"), 200)
    assert (max_len, tokens, took) == ("200", "5", "1")
    assert log.count("Engine core initialized in") == 1


def test_an_engine_with_another_config_starts_its_own_core(tiny_model_factory):
    """The engine's config differs from the one built before the fork: the early core is
    released and the engine serves from a core of its own, with its config."""
    (max_len, tokens, took), log = _early_core_run(tiny_model_factory("llama"), 100)
    assert (max_len, tokens, took) == ("100", "5", "0")
    assert "differs from the one its core was forked with" in log
