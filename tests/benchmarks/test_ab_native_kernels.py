"""ab_native_kernels.py: a git revision's kernel files are found, and both builds run
decode steps in one engine process (no timing assertions: these are measurements)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm.cpu import cpu_ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.ab_native_kernels import kernel_sources  # noqa: E402


def test_kernel_sources_of_a_revision_and_of_this_checkout(tmp_path):
    head = kernel_sources("HEAD", tmp_path)
    assert (head / "cpu_ops.cpp").is_file() and (head / "vec_math.h").is_file()
    here = kernel_sources(".", tmp_path)
    assert here.samefile(os.path.join(ROOT, "vllm", "cpu"))
    with pytest.raises(SystemExit, match="neither a folder nor a git revision"):
        kernel_sources("no-such-revision-xyz", tmp_path)


@pytest.mark.skipif(not cpu_ops.gemm_supported(), reason="needs the native bf16 kernels")
def test_two_builds_alternate_in_one_engine(tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama", hidden_size=256, num_attention_heads=4)
    out = tmp_path / "ab.json"
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", "ab_native_kernels.py"), "--model", model,
         "--dtype", "bfloat16", "--a", "HEAD", "--b", ".", "--batch-sizes", "2",
         "--input-len", "12", "--output-len", "5", "--rounds", "2", "--max-model-len", "64",
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    (row,) = r["rows"]
    assert row["batch"] == 2 and len(row["a_rounds"]) == len(row["b_rounds"]) == 2
    assert all(v > 0 for v in row["a_rounds"] + row["b_rounds"])
    assert "| 2 |" in proc.stdout
