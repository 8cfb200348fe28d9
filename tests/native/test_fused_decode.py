"""Decode steps through the native layer call equal the module path, bit for bit.

Both paths run the same kernels in the same order, so greedy tokens and their
logprobs must be identical, for Llama (two head sizes, both attention code paths)
and Qwen2 (projection biases), with bf16 weights (AVX512-BF16 or AVX2 CPUs) and with int4
weights (any CPU); Qwen3 (per-head q/k norms) must not take the fused path. With LoRA
the native layer adds the adapters' deltas itself: same tokens as the module path.
"""
from __future__ import annotations

import pytest
import torch

from vllm.cpu import fused_decode as llama_fused
from vllm.cpu import cpu_ops, quant_ops

needs_bf16_gemm = pytest.mark.skipif(not cpu_ops.gemm_supported(),
                                     reason="needs the native bf16 GEMM")

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time, in a small"]


def _generate(model: str, monkeypatch, fused: bool, prompts=PROMPTS, loras=None,
              plan=None, **engine_kwargs) -> tuple[list, int]:
    """(per prompt: tokens and top-2 logprobs, fused steps); with `loras`, the count is
    of fused steps that applied adapters."""
    from vllm import LLM, SamplingParams
    calls = []
    real_run = llama_fused.FusedDecode.run

    def run(self, *args):
        out = real_run(self, *args)
        adapters = self.lora_batch is not None and self.lora_batch.active
        calls.append(out is not None and (loras is None or adapters))
        return out

    monkeypatch.setattr(llama_fused.FusedDecode, "run", run)
    # Both paths on the native GEMM (the measured choice may prefer oneDNN for some
    # row counts, which the fused path then leaves to the modules).
    monkeypatch.setenv("VLLM_CPU_NATIVE_GEMM", "1")
    if plan is not None:  # every weight shape on this row-bucket plan instead
        from vllm.cpu import gemm_autotune
        monkeypatch.setattr(gemm_autotune, "plan_shapes",
                            lambda weights: {s: gemm_autotune.GemmPlan(plan) for s in weights})
    if not fused:
        monkeypatch.setattr(llama_fused.FusedDecode, "build", classmethod(lambda cls, l: None))
    llm = LLM(model=model, dtype="bfloat16", max_model_len=256, seed=0, **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    monkeypatch.undo()
    result = [(o.outputs[0].token_ids,
               [{k: v.logprob for k, v in lp.items()} for lp in o.outputs[0].logprobs])
              for o in outs]
    return result, sum(calls)


@needs_bf16_gemm
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


@pytest.mark.skipif(not cpu_ops.amx_gemm_supported(), reason="no AMX tiles on this CPU")
def test_fused_decode_runs_the_amx_rows_of_the_plan(tiny_model_factory, monkeypatch):
    """A plan with AMX at decode row counts: the fused layer's GEMMs read it from their
    context and run AMX where the modules would, so the two paths stay identical."""
    model = tiny_model_factory("llama", hidden_size=256, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=512)
    plan = ("native", "amx", "amx", "onednn", "onednn", "onednn")
    ref, _ = _generate(model, monkeypatch, fused=False, plan=plan)
    got, fused_calls = _generate(model, monkeypatch, fused=True, plan=plan)
    assert fused_calls >= 11
    assert got == ref
    native, _ = _generate(model, monkeypatch, fused=True)
    assert [t for t, _ in native] == [t for t, _ in ref]  # same greedy tokens either way


@needs_bf16_gemm
def test_qwen3_layers_do_not_qualify(tiny_model_factory):
    from vllm import LLM
    llm = LLM(model=tiny_model_factory("qwen3"), dtype="bfloat16", max_model_len=256)
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    layers = model.model._own_layers
    assert not any(llama_fused.layer_qualifies(layer) for layer in layers)
    assert model.model.fused_layers.forward_method_name == "fused_decode_layers_cpu"
    with torch.inference_mode():
        assert llama_fused.decode_runner(model.model.fused_layers) is None


# ---------------------------------------------------------------- int4 weights, LoRA
needs_quant_lib = pytest.mark.skipif(quant_ops.get_quant_lib() is None,
                                     reason="native quantized kernels unavailable")


@pytest.fixture(scope="module")
def gptq_models(tiny_model_factory, tmp_path_factory) -> dict:
    """arch -> (float model, int4 GPTQ checkpoint of it, group 32, symmetric)."""
    from tests.quantization._int_pack import write_gptq
    root = tmp_path_factory.mktemp("fused-int4")
    return {arch: (tiny_model_factory(arch),
                   write_gptq(tiny_model_factory(arch), str(root / arch), 4, 32, False, True))
            for arch in ("llama", "qwen2")}


@needs_quant_lib
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_decode_with_int4_weights_equals_the_module_path(gptq_models, monkeypatch, arch):
    """Every projection int4 (qwen2: plus bf16 qkv biases): the native layer calls the
    module path's own int4 kernel, so tokens and logprobs are identical."""
    model = gptq_models[arch][1]
    ref, ref_calls = _generate(model, monkeypatch, fused=False)
    got, fused_calls = _generate(model, monkeypatch, fused=True)
    assert ref_calls == 0
    assert fused_calls >= 11, "int4 decode steps should take the fused path"
    assert got == ref


@needs_quant_lib
def test_fused_decode_adds_lora_deltas_like_the_module_path(gptq_models, monkeypatch,
                                                            tmp_path):
    """A batch mixing two adapters (different ranks and targets) and the base model:
    the fused steps apply each row's adapter; tokens equal the module path's and the
    adapters change the output (so the deltas are really applied)."""
    from tests.lora.conftest import make_peft_adapter
    from vllm.lora.request import LoRARequest
    float_dir, int4_dir = gptq_models["llama"]
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    a = make_peft_adapter(float_dir, str(tmp_path / "a"), seed=1, scale=2.0, r=8,
                          lora_alpha=16, target_modules=targets)
    b = make_peft_adapter(float_dir, str(tmp_path / "b"), seed=2, scale=2.0, r=4,
                          lora_alpha=8, target_modules=["v_proj", "up_proj", "down_proj"])
    prompt = PROMPTS[0]
    loras = [LoRARequest("a", 1, a), LoRARequest("b", 2, b), None]
    kw = dict(prompts=[prompt] * 3, loras=loras, enable_lora=True, max_loras=2,
              max_lora_rank=8)
    ref, ref_calls = _generate(int4_dir, monkeypatch, fused=False, **kw)
    got, fused_calls = _generate(int4_dir, monkeypatch, fused=True, **kw)
    assert ref_calls == 0 and fused_calls >= 11
    assert [g[0] for g in got] == [r[0] for r in ref]
    for (_, lps_got), (_, lps_ref) in zip(got, ref):
        for d_got, d_ref in zip(lps_got, lps_ref):
            assert d_got.keys() == d_ref.keys()
            assert all(abs(d_got[k] - d_ref[k]) < 2e-2 for k in d_got)
    outputs = [tuple(g[0]) for g in got]
    assert len(set(outputs)) == 3, "each adapter (and the base) should decode differently"
