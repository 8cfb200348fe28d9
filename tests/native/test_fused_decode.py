"""Decode steps through the native layer call equal the module path, bit for bit.

Both paths run the same kernels in the same order, so greedy tokens and their
logprobs must be identical, for Llama (two head sizes, both attention code paths)
and Qwen2 (projection biases); Qwen3 (per-head q/k norms) must not take the fused path.
"""
from __future__ import annotations

import pytest
import torch

from vllm.model_executor.models import llama_fused
from vllm.native import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.gemm_supported(),
                                reason="needs the native AVX512-BF16 kernels")

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time, in a small"]


def _generate(model: str, monkeypatch, fused: bool) -> tuple[list, int]:
    from vllm import LLM, SamplingParams
    calls = []
    real_run = llama_fused.FusedDecode.run

    def run(self, *args):
        out = real_run(self, *args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(llama_fused.FusedDecode, "run", run)
    # Both paths on the native GEMM (the measured choice may prefer oneDNN for some
    # row counts, which the fused path then leaves to the modules).
    monkeypatch.setenv("VLLM_CPU_NATIVE_GEMM", "1")
    if not fused:
        monkeypatch.setattr(llama_fused.FusedDecode, "build", classmethod(lambda cls, l: None))
    llm = LLM(model=model, dtype="bfloat16", max_model_len=256, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    monkeypatch.undo()
    result = [(o.outputs[0].token_ids,
               [{k: v.logprob for k, v in lp.items()} for lp in o.outputs[0].logprobs])
              for o in outs]
    return result, sum(calls)


@pytest.mark.parametrize("arch,overrides", [
    ("llama", {}),  # head size 16: the portable attention loops
    ("llama", {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}),
    ("qwen2", {}),  # qkv bias
], ids=["llama-d16", "llama-d64", "qwen2-bias"])
def test_fused_decode_equals_the_module_path(tiny_model_factory, monkeypatch, arch, overrides):
    model = tiny_model_factory(arch, **overrides)
    ref, ref_calls = _generate(model, monkeypatch, fused=False)
    got, fused_calls = _generate(model, monkeypatch, fused=True)
    assert ref_calls == 0
    assert fused_calls >= 11, "every pure decode step should take the fused path"
    assert got == ref


def test_qwen3_layers_do_not_qualify(tiny_model_factory):
    from vllm import LLM
    llm = LLM(model=tiny_model_factory("qwen3"), dtype="bfloat16", max_model_len=256)
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    layers = model.model._own_layers
    assert not any(llama_fused.layer_qualifies(layer) for layer in layers)
    with torch.inference_mode():
        assert model.model._fused_decode() is None
