"""compare_hf.py: the workloads it defines, and one side-by-side run on a tiny model."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks.compare_hf import make_requests, workload_lengths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_workloads_have_the_documented_shapes():
    assert workload_lengths("batch16", 0) == [128] * 16
    assert workload_lengths("batch1", 0) == [128]
    mixed = workload_lengths("mixed64", 0)
    assert len(mixed) == 64 and min(mixed) == 32 and max(mixed) == 488
    assert 150 < sum(mixed) / 64 < 230
    assert mixed == workload_lengths("mixed64", 0)  # seeded
    reqs = make_requests("mixed64", 7, 0)
    assert [len(r.prompt_token_ids) for r in reqs] == mixed
    assert all(r.expected_output_len == 7 and r.use_token_ids for r in reqs)
    # No prompt prefix repeats across repetitions or workloads (the prefix cache would
    # skip prefills of the engine only).
    firsts = {tuple(make_requests(w, 7, 0, rep)[0].prompt_token_ids[:16])
              for w in ("batch16", "batch1", "mixed64") for rep in (0, 1)}
    assert len(firsts) == 6
    assert make_requests("batch16", 7, 0, 1)[3].prompt_token_ids == \
        make_requests("batch16", 7, 0, 1)[3].prompt_token_ids
    with pytest.raises(ValueError, match="workload must be one of"):
        workload_lengths("huge", 0)


def test_side_by_side_run_reports_both_backends(tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama")
    out = tmp_path / "cmp.json"
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", "compare_hf.py"), "--model", model,
         "--workloads", "batch1", "--reps", "2", "--output-len", "4",
         "--output-json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^Engine start-up: [\d.]+ s$", proc.stdout, re.M), proc.stdout
    lines = re.findall(r"^batch1   rep \d: .* ratio ([\d.]+)x", proc.stdout, re.M)
    assert len(lines) == 2, proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["rep"] for r in runs] == [0, 1]
    for r in runs:
        assert r["ratio"] == pytest.approx(r["vllm_output_tok_s"] / r["hf_output_tok_s"])
        assert r["vllm_elapsed_s"] > 0 and r["hf_elapsed_s"] > 0
