"""benchmark_throughput.py and benchmark_latency.py end to end on a tiny random model."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks.benchmark_throughput import hf_batches
from benchmarks.datasets import SampleRequest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THROUGHPUT_RE = re.compile(r"^Throughput: ([\d.]+) requests/s, ([\d.]+) total tokens/s, "
                           r"([\d.]+) output tokens/s$", re.M)


def _run(script: str, *args: str) -> str:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, os.path.join("benchmarks", script), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _check_throughput(stdout: str, json_path, prompt_tokens: int, output_tokens: int):
    match = THROUGHPUT_RE.search(stdout)
    assert match, stdout
    assert f"Total num prompt tokens:  {prompt_tokens}\n" in stdout
    assert f"Total num output tokens:  {output_tokens}\n" in stdout
    result = json.loads(json_path.read_text())
    assert result["total_output_tokens"] == output_tokens
    assert result["total_num_tokens"] == prompt_tokens + output_tokens
    assert result["requests_per_second"] == pytest.approx(float(match.group(1)), abs=0.01)
    assert result["tokens_per_second"] == pytest.approx(float(match.group(2)), abs=0.01)
    return result


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_throughput_random_fixed_lengths(backend, tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama")
    out = tmp_path / "tp.json"
    stdout = _run("benchmark_throughput.py", "--backend", backend, "--model", model,
                  "--input-len", "16", "--output-len", "8", "--num-prompts", "5",
                  "--max-num-seqs", "4", "--output-json", str(out), "--disable-tqdm",
                  *(["--hf-max-batch-size", "2"] if backend == "hf" else []))
    result = _check_throughput(stdout, out, prompt_tokens=80, output_tokens=40)
    assert result["num_requests"] == 5 and result["backend"] == backend


def test_throughput_vllm_synthetic_and_sharegpt(tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama")
    out = tmp_path / "tp.json"
    stdout = _run("benchmark_throughput.py", "--model", model, "--dataset-name", "synthetic",
                  "--num-prompts", "4", "--output-len", "6", "--seed", "1",
                  "--output-json", str(out), "--disable-tqdm")
    assert THROUGHPUT_RE.search(stdout), stdout
    assert json.loads(out.read_text())["total_output_tokens"] == 24

    data = [{"conversations": [{"from": "human", "value": f"Question {i}: tell me about "
                                f"rivers, mountains and the sea in a few words."},
                               {"from": "gpt", "value": "Rivers run from the mountains "
                                "down to the sea, carving valleys."}]} for i in range(3)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    stdout = _run("benchmark_throughput.py", "--model", model, "--dataset", str(path),
                  "--num-prompts", "3", "--output-json", str(out), "--disable-tqdm")
    assert THROUGHPUT_RE.search(stdout), stdout
    result = json.loads(out.read_text())
    assert result["num_requests"] == 3 and result["total_output_tokens"] > 3 * 4


def test_throughput_rejects_bad_flags(tiny_model_factory):
    model = tiny_model_factory("llama")
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run([sys.executable, "benchmarks/benchmark_throughput.py", "--model",
                           model, "--num-prompts", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--input-len" in proc.stderr


def test_hf_batches_follow_vllm_rule():
    def req(p, o):
        return SampleRequest("x", p, o, [0] * p)
    reqs = [req(10, 10), req(10, 10), req(10, 10), req(500, 600), req(10, 10)]
    sizes = [len(b) for b in hf_batches(reqs, max_batch_size=2, max_model_len=1024)]
    assert sizes == [2, 1, 1, 1]  # batch of 2 full; 500+600 > 1024 splits the next
    assert [len(b) for b in hf_batches(reqs, 8, 4096)] == [5]


def test_latency_reports_percentiles(tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama")
    out = tmp_path / "lat.json"
    stdout = _run("benchmark_latency.py", "--model", model, "--batch-size", "2",
                  "--input-len", "8", "--output-len", "4", "--num-iters-warmup", "1",
                  "--num-iters", "3", "--output-json", str(out))
    assert re.search(r"^Avg latency: [\d.e-]+ seconds$", stdout, re.M), stdout
    for p in (10, 25, 50, 75, 90, 99):
        assert re.search(rf"^{p}% percentile latency: [\d.e-]+ seconds$", stdout, re.M)
    result = json.loads(out.read_text())
    assert len(result["latencies"]) == 3
    assert min(result["latencies"]) <= result["avg_latency"] <= max(result["latencies"])
    assert set(result["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
