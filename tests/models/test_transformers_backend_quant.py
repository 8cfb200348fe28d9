"""Quantized checkpoints on the Transformers modeling backend: the backend's linear
layers are ours, so they take the checkpoint's quantization method. An OLMo 2 model
(no native class) quantized by `compressed-tensors` (W4A16 groups, FP8 dynamic) and in
GPTQ's packed layout gives the reference's greedy tokens (the library's
quantize-dequantize model; transformers on the dequantized GPTQ weights), and
`--quantization fp8` gives the native path's tokens on Llama."""
from __future__ import annotations

import pytest

from tests.quantization._ckpt import quantize_with_library, reference_greedy, save_compressed

PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory) -> str:
    from tests.conftest import make_tiny_model
    return make_tiny_model(str(tmp_path_factory.mktemp("olmo2-float")), "olmo2",
                           hidden_size=128, intermediate_size=256)


def _backend_greedy(path: str, **kwargs) -> list[list[int]]:
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, max_model_len=256, kv_cache_memory_bytes=16 << 20,
              model_impl=kwargs.pop("model_impl", "transformers"), **kwargs)
    try:
        model = llm.llm_engine.engine_core.executor.worker.model_runner.model
        methods = {type(m.quant_method).__name__ for m in model.modules()
                   if hasattr(m, "quant_method")}
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True), use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    assert methods - {"UnquantizedLinearMethod"}, methods  # the backend's linears quantized
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("scheme", ["W4A16", "FP8_DYNAMIC"])
def test_compressed_tensors_checkpoint(olmo2, tmp_path, scheme):
    ref, tok = quantize_with_library(olmo2, scheme, group_size=32)
    expected = [reference_greedy(ref, tok.encode(p), MAX_TOKENS) for p in PROMPTS]
    path = save_compressed(ref, tok, str(tmp_path / scheme))
    assert _backend_greedy(path, dtype="float32") == expected


def test_gptq_checkpoint(olmo2, tmp_path):
    import torch
    import transformers
    from tests.quantization._int_pack import write_gptq
    path = write_gptq(olmo2, str(tmp_path / "gptq"), 4, 32, desc_act=False, sym=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path + "-deq",
                                                            dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    expected = [reference_greedy(ref, tok.encode(p), MAX_TOKENS) for p in PROMPTS]
    assert _backend_greedy(path, dtype="float32") == expected


def test_online_fp8_equals_native_path(tmp_path):
    from tests.models._tiny_families import save_tiny
    path = save_tiny(str(tmp_path), "LlamaConfig", num_key_value_heads=2)
    native = _backend_greedy(path, dtype="bfloat16", quantization="fp8", model_impl="vllm")
    assert _backend_greedy(path, dtype="bfloat16", quantization="fp8") == native
