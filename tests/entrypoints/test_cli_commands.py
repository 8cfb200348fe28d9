"""`vllm run-batch` on a 20-line OpenAI batch file and `vllm collect-env` on CPU and the
fake HPU (the CLI run as a user runs it; tiny random-weight model)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def vllm(*argv: str, env: dict | None = None, stdin: str | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", *argv],
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          input=stdin, cwd=ROOT)


def batch_lines(model: str) -> list[dict]:
    lines = []
    for i in range(16):
        if i % 2:
            body = {"model": model, "messages": [{"role": "user", "content": f"Say {i}"}],
                    "max_tokens": 4, "temperature": 0}
            url = "/v1/chat/completions"
        else:
            body = {"model": model, "prompt": f"Count to {i}:", "max_tokens": 4,
                    "temperature": 0}
            url = "/v1/completions"
        lines.append({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body})
    lines.append({"custom_id": "bad-url", "method": "POST", "url": "/v1/nope", "body": {}})
    lines.append({"custom_id": "bad-body", "method": "POST", "url": "/v1/completions",
                  "body": {"model": model, "prompt": "x", "max_tokens": -3}})
    lines.append({"custom_id": "stream", "method": "POST", "url": "/v1/completions",
                  "body": {"model": model, "prompt": "x", "stream": True}})
    lines.append({"custom_id": "embed", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": model, "input": "x"}})
    return lines


def test_run_batch_twenty_lines(tmp_path, tiny_model_factory):
    model = tiny_model_factory("llama")
    lines = batch_lines(model)
    assert len(lines) == 20
    src = tmp_path / "batch.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json\n")
    out = tmp_path / "results.jsonl"
    proc = vllm("run-batch", "-i", str(src), "-o", str(out), "--model", model,
                "--dtype", "float32", "--max-model-len", "256",
                "--kv-cache-memory-bytes", str(16 << 20))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [line["custom_id"] for line in lines] + [None]
    assert all(r["id"].startswith("vllm-") for r in results)
    for r in results[:16]:
        assert r["error"] is None and r["response"]["status_code"] == 200, r
        body = r["response"]["body"]
        assert body["usage"]["completion_tokens"] == 4
        if r["custom_id"] in ("req-1", "req-3"):
            assert body["object"] == "chat.completion"
    by_id = {r["custom_id"]: r for r in results}
    assert "not supported" in by_id["bad-url"]["error"]
    assert by_id["bad-body"]["response"]["status_code"] == 400
    assert by_id["bad-body"]["error"]["param"] == "max_tokens"
    assert "streaming" in by_id["stream"]["error"]
    assert 400 <= by_id["embed"]["response"]["status_code"] < 500  # a generative model
    assert results[-1]["error"].startswith("the line is not JSON")
    # The same answers as the server gives: greedy chat through the batch equals offline.
    from vllm import LLM, SamplingParams
    llm = LLM(model=model, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=16 << 20)
    offline = llm.generate(["Count to 0:"], SamplingParams(max_tokens=4, temperature=0),
                           use_tqdm=False)[0].outputs[0].text
    assert by_id["req-0"]["response"]["body"]["choices"][0]["text"] == offline


@pytest.mark.parametrize("env, platform", [
    ({"VLLM_TARGET_DEVICE": "cpu"}, "CpuPlatform"),
    ({"VLLM_TARGET_DEVICE": "hpu", "VLLM_USE_FAKE_HPU": "1"}, "HpuPlatform"),
])
def test_collect_env(env, platform):
    proc = vllm("collect-env", env={**env, "VLLM_API_KEY": "do-not-print-me"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for section in ("System", "vLLM", "torch", "Gaudi", "Packages", "Environment variables"):
        assert f"===== {section} =====" in out
    assert f"platform: vllm." in out and platform in out
    assert "CPU: " in out and "torch: " in out
    assert "VLLM_API_KEY: ***" in out and "do-not-print-me" not in out
    if platform == "HpuPlatform":
        assert "fake HPU: True" in out
