"""bf16 through the native kernels is as close to float32 as bf16 through torch ops.

Teacher-forced prompt logprobs of the embedded model on ~400 tokens of text (short
enough for the row-wise prompt attention): the mean distance to the float32 run must
stay at the level of the torch-op bf16 path (same dtype, different kernels).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from vllm.cpu import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.usable(torch.empty(0)),
                                reason="native CPU kernels unavailable")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _prompt_logprobs(dtype: str, text: str) -> np.ndarray:
    from vllm import LLM, SamplingParams
    llm = LLM(dtype=dtype, max_model_len=1024, enable_prefix_caching=False)
    out = llm.generate([text], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    return np.array([next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]])


def test_native_bf16_is_as_accurate_as_torch_bf16(monkeypatch):
    with open(os.path.join(ROOT, "vllm", "benchmarks", "data", "corpus.txt")) as f:
        text = f.read()[:1800]
    ref = _prompt_logprobs("float32", text)
    assert 200 < len(ref) < 500
    native = _prompt_logprobs("bfloat16", text)
    monkeypatch.setattr(cpu_ops, "supports", lambda dtype: False)
    monkeypatch.setattr(cpu_ops, "_GEMM", {"ok": False})
    plain = _prompt_logprobs("bfloat16", text)
    err_native = float(np.abs(native - ref).mean())
    err_plain = float(np.abs(plain - ref).mean())
    print(f"mean |dlogprob| vs float32: native {err_native:.4f}, torch ops {err_plain:.4f}")
    assert err_native < 0.08 and err_plain < 0.08
    assert err_native <= 1.3 * err_plain + 0.01, (err_native, err_plain)
