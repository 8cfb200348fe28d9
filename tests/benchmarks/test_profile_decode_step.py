"""profile_decode_step.py: both paths run and the breakdown adds up to the step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm.cpu import cpu_ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not cpu_ops.gemm_supported(), reason="needs the native bf16 kernels")
def test_breakdown_of_a_tiny_model(tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama", hidden_size=256, num_attention_heads=4)
    out = tmp_path / "profile.json"
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", "profile_decode_step.py"), "--model",
         model, "--dtype", "bfloat16", "--batch-size", "3", "--input-len", "20",
         "--output-len", "6", "--max-model-len", "128", "--output-json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    modules, fused = r["module_path"], r["fused_path"]
    assert modules["decode_steps"] == fused["decode_steps"] == 5
    kernels = modules["kernels_ms_per_step"]
    assert {"decode_attention", "rms_norm"} <= set(kernels)
    # The measured plan runs the GEMMs on bf16 dot products or, on AMX CPUs, AMX tiles.
    assert set(kernels) & {"gemm_bf16_packed", "gemm_bf16_amx"}
    assert 0 < sum(kernels.values()) < modules["decode_step_ms"]
    assert "rest (Python, runner, sampling)" in proc.stdout
