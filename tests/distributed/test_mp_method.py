"""Worker start method (VLLM_WORKER_MULTIPROC_METHOD): a TP=2 script read from standard input
works with the default (fork on CPU), and spawn fails early with a clear message."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from _dist_helpers import ENGINE_KWARGS, MAX_TOKENS, PROMPTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    llm = LLM({model!r}, tensor_parallel_size=2, **{kwargs!r})
    params = SamplingParams(temperature=0.0, max_tokens={max_tokens}, ignore_eos=True)
    outs = llm.generate({prompts!r}, params, use_tqdm=False)
    print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
""")


def run_stdin_script(model: str, method: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    if method is not None:
        env["VLLM_WORKER_MULTIPROC_METHOD"] = method
    script = SCRIPT.format(model=model, kwargs=ENGINE_KWARGS, max_tokens=MAX_TOKENS,
                           prompts=PROMPTS)
    return subprocess.run([sys.executable, "-"], input=script, env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_tp2_script_from_stdin_with_default_method(tiny_qwen2, tiny_reference):
    import json
    proc = run_stdin_script(tiny_qwen2, None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    assert json.loads(line[len("RESULT "):]) == tiny_reference


def test_forked_workers_exit_when_the_engine_dies(tiny_qwen2):
    """Each forked worker must hold no other worker's engine-side pipe ends, or an abrupt
    engine death would go unnoticed by the workers that inherited them."""
    import psutil

    from _dist_helpers import wait_gone
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    script = textwrap.dedent(f"""
        import os
        from vllm import LLM
        llm = LLM({tiny_qwen2!r}, tensor_parallel_size=2, **{ENGINE_KWARGS!r})
        print("PIDS", *llm.llm_engine.engine_core.executor.worker_pids, flush=True)
        os._exit(3)  # no cleanup at all, like a SIGKILL
    """)
    proc = subprocess.run([sys.executable, "-"], input=script, env=env, capture_output=True,
                          text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr[-3000:]
    # Workers may still log after the PIDS line (the KV cache's background commit).
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PIDS "))
    pids = {int(p) for p in line.split()[1:]}
    assert len(pids) == 2
    left = wait_gone(pids, timeout_s=20)
    assert not left, [psutil.Process(p).cmdline() for p in left]


def test_spawn_from_stdin_fails_clearly(tiny_qwen2):
    proc = run_stdin_script(tiny_qwen2, "spawn")
    assert proc.returncode != 0
    assert "read from '<stdin>'" in proc.stderr and "VLLM_WORKER_MULTIPROC_METHOD=fork" in \
        proc.stderr, proc.stderr[-3000:]


def test_method_resolution(monkeypatch):
    from vllm.executor import multiproc_utils
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "thread")
    with pytest.raises(ValueError, match="VLLM_WORKER_MULTIPROC_METHOD='thread'"):
        multiproc_utils.resolve_mp_method()
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    assert multiproc_utils.resolve_mp_method() == "fork"  # this test process: CPU only
    import types
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch",
                        types.ModuleType("habana_frameworks.torch"))
    assert "HPU runtime" in multiproc_utils.fork_unsafe_reason()
    assert multiproc_utils.resolve_mp_method() == "spawn"
    monkeypatch.delitem(sys.modules, "habana_frameworks.torch")
    monkeypatch.setattr(multiproc_utils, "fork_unsafe_reason",
                        lambda: "CUDA was initialized in this process")
    assert multiproc_utils.resolve_mp_method() == "spawn"
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD")
    assert multiproc_utils.resolve_mp_method() == "spawn"
