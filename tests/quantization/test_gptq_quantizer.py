"""The project's GPTQ (benchmarks/gptq.py) and its checkpoint writer.

GPTQ's point is a smaller layer output error than round-to-nearest on the calibration
inputs, for the same grid: a wrong error propagation (sign, scale, order, the update
of later blocks) loses that, so the tests measure it. The written checkpoint is read
back by the engine and compared with transformers on the quantizer's dequantized
weights, and its words with the test-side packer of the published GPTQ layout.
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.gptq import GPTQArgs, HessianRecorder, gptq_quantize, rtn_quantize


def _correlated_inputs(n: int, k: int, seed: int) -> torch.Tensor:
    """Activations with correlated features and a few large ones, like a transformer's
    (one fixed distribution per k; `seed` draws the samples)."""
    fixed = torch.Generator().manual_seed(k)
    mix = torch.randn(k // 4, k, generator=fixed)
    loud = torch.randperm(k, generator=fixed)[:4]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k // 4, generator=gen) @ mix + 0.3 * torch.randn(n, k, generator=gen)
    x[:, loud] *= 8
    return x


def _output_error(x, w, deq) -> float:
    return float(((x @ (w - deq).t()) ** 2).mean())


@pytest.mark.parametrize("k, group, sym, act_order, static", [
    (256, 64, False, False, False), (192, 128, True, False, False),
    (192, 128, False, True, False), (320, -1, False, False, False),
    (320, 128, False, True, True)])
def test_gptq_lowers_output_error_vs_rtn(k, group, sym, act_order, static):
    x = _correlated_inputs(1024, k, seed=0)
    w = torch.randn(48, k, generator=torch.Generator().manual_seed(1)) * 0.05
    rec = HessianRecorder(k)
    rec(None, (x,))
    args = GPTQArgs(bits=4, group_size=group, sym=sym, act_order=act_order, block=64,
                    static_groups=static, mse_clip=static)
    gptq, rtn = gptq_quantize(w, rec.hessian(), args), rtn_quantize(w, args)
    for ql in (gptq, rtn):
        assert ql.q.min() >= 0 and ql.q.max() <= 15
        groups = -(-k // (k if group == -1 else group))
        assert ql.scales.shape == (groups, 48)
        assert torch.bincount(ql.g_idx).tolist() == torch.bincount(
            torch.arange(k) // (k if group == -1 else group)).tolist()
    e_gptq, e_rtn = _output_error(x, w, gptq.dequantize()), _output_error(x, w, rtn.dequantize())
    assert e_gptq < 0.45 * e_rtn, (e_gptq, e_rtn)
    # and on inputs it did not see, from the same distribution
    x2 = _correlated_inputs(512, k, seed=1)
    assert _output_error(x2, w, gptq.dequantize()) < _output_error(x2, w, rtn.dequantize())
    if act_order:  # groups follow decreasing diag(H), so g_idx is not k // group,
        # unless static groups keep them in input order
        assert torch.equal(gptq.g_idx, torch.arange(k) // group) == static


def test_gptq_checkpoint_loads_and_matches_transformers(tmp_path):
    """quantize_checkpoint.py --method gptq on a tiny Llama with K = 192 / 320 and
    group 128 (shorter last groups), act-order: the engine's logits and greedy tokens
    equal transformers' on the quantizer's dequantized weights."""
    import argparse

    import transformers
    from benchmarks.gptq import pack_int32
    from benchmarks.quantize_checkpoint import quantize_gptq
    from safetensors.torch import load_file
    from tests.conftest import make_tiny_model
    from tests.engine.conftest import PROMPTS
    from tests.quantization._ckpt import reference_greedy
    from tests.quantization._int_pack import pack_words
    from tests.quantization.test_int4 import _close, _engine_logits, _ids
    float_dir = make_tiny_model(str(tmp_path / "float"), "llama", hidden_size=192,
                                intermediate_size=320, num_attention_heads=3,
                                num_key_value_heads=1)
    args = argparse.Namespace(bits=4, group_size=128, sym=False, act_order=True, damp=0.01,
                              mse_clip=True, true_sequential=True, static_groups=False,
                              calibration=None,
                              calibration_tokens=512)
    from benchmarks import quantize_checkpoint
    args.calibration = quantize_checkpoint.CORPUS
    path = quantize_gptq(float_dir, str(tmp_path / "gptq"), "gptq", args)
    # reference: transformers on the dequantized weights of the same run
    ref = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    from benchmarks.gptq import QuantizedLinear
    tensors = load_file(f"{path}/model.safetensors")
    vals = torch.randint(0, 16, (64, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(pack_int32(vals, 4, 0), pack_words(vals, 4, 0))
    assert torch.equal(pack_int32(vals, 4, 1), pack_words(vals, 4, 1))
    from vllm.model_executor.layers.quantization.int_weights import unpack_int32
    with torch.no_grad():
        for name, module in ref.named_modules():
            if f"{name}.qweight" not in tensors:
                continue
            ql = QuantizedLinear(unpack_int32(tensors[f"{name}.qweight"], 4, 0).t().long(),
                                 tensors[f"{name}.scales"],
                                 unpack_int32(tensors[f"{name}.qzeros"], 4, 1).long() + 1,
                                 tensors[f"{name}.g_idx"].long())
            module.weight.copy_(ql.dequantize())
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = _ids(tok)
    _, ours = _engine_logits(path, ids)
    with torch.no_grad():
        _close(ours, ref(ids[None]).logits[0])
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == reference_greedy(ref, tok.encode(prompt), 8)
