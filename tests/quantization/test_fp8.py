"""FP8 weights: `--quantization fp8` and compressed-tensors FP8 checkpoints.

The reference is compressed-tensors' own quantize-dequantize simulation of the same
scheme on the same weights (see _ckpt.py). Everything runs in float32, where every
fp8 value and every product of two is exact: the engine and the reference then
differ only by summation order, and by an activation that rounds to the other fp8
neighbour when its scaled value sits on a rounding boundary (one fp8 step, 1/16
relative, of one element). So logits agree to 2e-3 of their range, and greedy
tokens are identical.
"""
from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import PROMPTS
from tests.models._model_helpers import full_prompt_logits, make_vllm_config
from tests.quantization._ckpt import (float_dir, quantize_with_library, reference_greedy,
                                      save_compressed)

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_float(tmp_path_factory) -> str:
    return float_dir(str(tmp_path_factory.mktemp("fp8")))


def _engine_model(path: str, quantization=None):
    from vllm.model_executor.model_loader import get_model
    cfg = make_vllm_config(path)
    if quantization is not None:
        from vllm.transformers_utils.config import create_model_config
        cfg.model_config = create_model_config(model=path, dtype="float32",
                                               quantization=quantization)
    return get_model(cfg)


def _check_logits(model, reference, tok) -> None:
    ids = torch.tensor(tok.encode(PROMPTS[1] + " " + PROMPTS[3]))
    ours = full_prompt_logits(model, ids)
    with torch.no_grad():
        ref = reference(ids[None]).logits[0]
    span = float(ref.max() - ref.min())
    assert (ours - ref).abs().max().item() < 2e-3 * span


def _check_greedy(path: str, reference, tok, **llm_kwargs) -> None:
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=32 << 20, **llm_kwargs)
    ids = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(ids, outs):
        assert out.outputs[0].token_ids == reference_greedy(reference, prompt, MAX_TOKENS)


@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_online_fp8_matches_library(tiny_float, granularity, monkeypatch):
    monkeypatch.setenv("VLLM_FP8_WEIGHT_SCALE", granularity)
    ref, tok = quantize_with_library(tiny_float, "FP8_DYNAMIC", weight_strategy=granularity)
    model = _engine_model(tiny_float, "fp8")
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn
    assert qkv.weight_scale.shape == (qkv.weight.shape[0],)
    _check_logits(model, ref, tok)
    if granularity == "tensor":
        _check_greedy(tiny_float, ref, tok, quantization="fp8")


@pytest.mark.parametrize("scheme", ["FP8", "FP8_DYNAMIC"])
def test_compressed_tensors_fp8_checkpoint(tiny_float, tmp_path, scheme):
    """FP8: per-tensor weights, static per-tensor activations; FP8_DYNAMIC: per-channel
    weights, dynamic per-token activations."""
    ref, tok = quantize_with_library(tiny_float, scheme)
    logits_ref = ref  # the QDQ forward, before the library compresses the weights in place
    ids = torch.tensor(tok.encode(PROMPTS[1] + " " + PROMPTS[3]))
    with torch.no_grad():
        expected = logits_ref(ids[None]).logits[0]
    greedy = {p: reference_greedy(ref, tok.encode(p), MAX_TOKENS) for p in PROMPTS}
    path = save_compressed(ref, tok, str(tmp_path / scheme))
    model = _engine_model(path)
    layer = model.model.layers[0].mlp.gate_up_proj
    assert layer.weight.dtype == torch.float8_e4m3fn
    assert hasattr(layer, "input_scale") == (scheme == "FP8")
    ours = full_prompt_logits(model, ids)
    span = float(expected.max() - expected.min())
    assert (ours - expected).abs().max().item() < 2e-3 * span
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == greedy[prompt]
