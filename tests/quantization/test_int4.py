"""int4/int8 weights: GPTQ, AWQ and compressed-tensors W4A16.

GPTQ/AWQ: neither gptqmodel nor autoawq installs here without replacing torch, so
their bit layouts are checked on hand-computed words, and model checkpoints are
written from the published layout by the test's own packer (_int_pack.py); the
reference is transformers on the dequantized float weights. compressed-tensors
checkpoints are made by the library itself, the reference is its QDQ model.
Everything runs in float32: the engine computes the same dequantized product in
another summation order (the native kernel factors the scale out of each group),
so logits agree to 1e-4 of their range and greedy tokens are identical.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.engine.conftest import PROMPTS
from tests.models._model_helpers import full_prompt_logits, make_vllm_config
from tests.quantization._ckpt import quantize_with_library, reference_greedy, save_compressed
from tests.quantization._int_pack import awq_pack, pack_words, write_awq, write_gptq
from vllm.model_executor.layers.quantization.int_weights import unpack_awq, unpack_int32

MAX_TOKENS = 12
TOL = 1e-4


def test_bit_layouts_on_hand_computed_words():
    # GPTQ: values 1..8 along the input in one int32, first value in the lowest nibble.
    word = torch.tensor([[0x87654321 - 2**32]], dtype=torch.int32)
    assert unpack_int32(word, 4, 0).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert unpack_int32(word, 4, 1).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert pack_words(torch.arange(1, 9).view(8, 1), 4, 0).item() == 0x87654321 - 2**32
    # 8 bits: four values per word.
    assert unpack_int32(torch.tensor([[0x04030201]], dtype=torch.int32), 8, 1).tolist() == [
        [1, 2, 3, 4]]
    # AWQ: columns 1..8 are stored in nibble order (0, 2, 4, 6, 1, 3, 5, 7): 0x86427531.
    awq_word = torch.tensor([[0x86427531 - 2**32]], dtype=torch.int32)
    assert unpack_awq(awq_word).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert awq_pack(torch.arange(1, 9).view(1, 8)).item() == 0x86427531 - 2**32


@pytest.fixture(scope="module")
def tiny_float(tmp_path_factory) -> str:
    from tests.conftest import make_tiny_model
    path = str(tmp_path_factory.mktemp("int") / "float")
    # K = 128 / 256 so that group sizes 32, 64, 128 and -1 all apply.
    return make_tiny_model(path, "llama", hidden_size=128, intermediate_size=256)


def _ids(tok):
    return torch.tensor(tok.encode(PROMPTS[1] + " " + PROMPTS[3]))


def _engine_logits(path: str, ids: torch.Tensor, dtype: str = "float32"):
    from vllm.model_executor.model_loader import get_model
    model = get_model(make_vllm_config(path, dtype=dtype))
    return model, full_prompt_logits(model, ids).float()


def _hf(path: str):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _greedy_matches(path: str, ref, tok) -> None:
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    ids = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(ids, outs):
        assert out.outputs[0].token_ids == reference_greedy(ref, prompt, MAX_TOKENS)


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    span = float(ref.max() - ref.min())
    assert (ours - ref).abs().max().item() < TOL * span


@pytest.mark.parametrize("bits, group, desc_act, sym, greedy", [
    (4, 128, False, True, True), (4, 32, True, False, False), (4, 64, False, False, False),
    (4, -1, True, True, False), (8, 32, True, True, True), (8, -1, False, False, False)])
def test_gptq_matches_dequantized_transformers(tiny_float, tmp_path, bits, group, desc_act,
                                               sym, greedy):
    import transformers
    path = write_gptq(tiny_float, str(tmp_path / "gptq"), bits, group, desc_act, sym)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ref = _hf(path + "-deq")
    ids = _ids(tok)
    model, ours = _engine_logits(path, ids)
    layer = model.model.layers[0].mlp.gate_up_proj
    assert layer.w_q.dtype == torch.uint8
    assert (layer.w_perm is not None) == (desc_act and group != -1)  # one group: no order
    with torch.no_grad():
        _close(ours, ref(ids[None]).logits[0])
    if greedy:
        _greedy_matches(path, ref, tok)


@pytest.fixture(scope="module")
def tiny_partial(tmp_path_factory) -> str:
    """K = 192 (q/k/v/o, gate/up) and 320 (down): group 128 leaves a last group of 64."""
    from tests.conftest import make_tiny_model
    path = str(tmp_path_factory.mktemp("int") / "partial")
    return make_tiny_model(path, "llama", hidden_size=192, intermediate_size=320,
                           num_attention_heads=3, num_key_value_heads=1)


@pytest.mark.parametrize("bits, desc_act, sym, greedy", [
    (4, False, True, True), (4, True, False, False), (8, False, False, False)])
def test_gptq_partial_last_group(tiny_partial, tmp_path, bits, desc_act, sym, greedy):
    """GPTQ's shorter last group (ceil(K/128) scale rows, g_idx = k // 128, as AutoGPTQ
    and GPTQModel write it for K = 192, 320): same logits and greedy tokens as
    transformers on the dequantized weights, through the native int4 kernel."""
    import transformers
    path = write_gptq(tiny_partial, str(tmp_path / "gptq"), bits, 128, desc_act, sym)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ref = _hf(path + "-deq")
    ids = _ids(tok)
    model, ours = _engine_logits(path, ids)
    down = model.model.layers[0].mlp.down_proj
    assert down.w_scales.shape[1] == 5  # 320 inputs on the gcd(128, 320) = 64 grid
    with torch.no_grad():
        _close(ours, ref(ids[None]).logits[0])
    if bits == 4:
        from vllm.cpu import quant_ops
        x = torch.randn(2, 320, generator=torch.Generator().manual_seed(0))
        w = ref.model.layers[0].mlp.down_proj.weight.detach()
        if quant_ops.int4_supported(x, 64):  # the decode kernel's rows on that grid
            torch.testing.assert_close(down.quant_method.apply(down, x), x @ w.t(),
                                       rtol=1e-5, atol=1e-4)
        # Gaudi's layout of the same layer (qweight [K/8, N] for convert_from_uint4,
        # through the HPU shim): the same product
        from vllm.hpu.ops import int4_layout_hpu, int4_linear_hpu
        from vllm.model_executor.layers.quantization.int_weights import unpack_nibbles
        method = down.quant_method
        int4_layout_hpu(down, unpack_nibbles(down.w_q))
        method.int4_linear = int4_linear_hpu  # what the HPU platform's kernel table binds
        torch.testing.assert_close(method.apply(down, x), x @ w.t(), rtol=1e-5, atol=1e-4)
    if greedy:
        _greedy_matches(path, ref, tok)


def test_compressed_tensors_refuses_partial_last_group(tiny_partial, tmp_path):
    """The library itself will not quantize a 192-input layer with groups of 128, so such
    a compressed-tensors checkpoint cannot be real: the engine names the layer."""
    import json
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                            group_size=128)
    with pytest.raises(ValueError, match="divisble|divisible"):  # the library's spelling
        quantize(torch.randn(8, 192), torch.ones(8, 2), torch.zeros(8, 2), args)
    ref, tok = quantize_with_library(tiny_partial, "W4A16", group_size=64)
    path = save_compressed(ref, tok, str(tmp_path / "ct"))
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 128
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"input size \(192\) of layer .*group_size 128"):
        _engine_logits(path, torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("group", [32, 128])
def test_awq_matches_dequantized_transformers(tiny_float, tmp_path, group):
    import transformers
    path = write_awq(tiny_float, str(tmp_path / "awq"), group)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ref = _hf(path + "-deq")
    ids = _ids(tok)
    _, ours = _engine_logits(path, ids)
    with torch.no_grad():
        _close(ours, ref(ids[None]).logits[0])
    if group == 128:
        _greedy_matches(path, ref, tok)


@pytest.mark.parametrize("scheme", ["W4A16", "W4A16_ASYM"])
def test_compressed_tensors_w4a16(tiny_float, tmp_path, scheme):
    ref, tok = quantize_with_library(tiny_float, scheme, group_size=32)
    ids = _ids(tok)
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
    greedy = {p: reference_greedy(ref, tok.encode(p), MAX_TOKENS) for p in PROMPTS}
    path = save_compressed(ref, tok, str(tmp_path / scheme))
    _, ours = _engine_logits(path, ids)
    _close(ours, expected)
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == greedy[prompt]


@pytest.mark.parametrize("n, k, gs", [(48, 256, 64), (11, 288, 96), (6, 160, 32)])
def test_native_int4_kernel_matches_dequantized_product(n, k, gs):
    """Decode rows (1..8) through the native kernel equal x @ dequant(W)^T (bf16 too);
    odd run counts and groups that split a pair of runs (288 = 9 runs of 32, groups of
    3 runs) included."""
    from vllm.model_executor.layers.quantization.int_weights import pack_nibbles
    from vllm.cpu import quant_ops
    if quant_ops.get_quant_lib() is None:
        pytest.skip("no native library")
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (n, k), generator=gen)
    s = torch.rand(n, k // gs, generator=gen) + 0.1
    z = torch.randint(0, 16, (n, k // gs), generator=gen).float()
    w = ((q.float().view(n, -1, gs) - z[..., None]) * s[..., None]).view(n, k)
    bias = torch.randn(n, generator=gen)
    for rows in (1, 3, 8):
        x = torch.randn(rows, k, generator=gen)
        out = quant_ops.gemm_int4(x, pack_nibbles(q), s, z, bias)
        torch.testing.assert_close(out, x @ w.t() + bias, rtol=1e-5, atol=1e-4)
        out16 = quant_ops.gemm_int4(x.bfloat16(), pack_nibbles(q), s, z, bias)
        assert out16.dtype == torch.bfloat16
        x16 = x.bfloat16().float()
        exact = x16 @ w.t() + bias
        torch.testing.assert_close(out16.float(), exact, rtol=1e-2,
                                   atol=2e-2 * exact.abs().max().item())
        # A bf16 bias: the layers' own entry (vllm_int4_linear_bf16, as the fused decode
        # layer calls it); with int8 runs there, runs of 32 inputs are rounded to int8
        # (scale max|x| / 127): that product, up to the bf16 output rounding and
        # float32 sums around the zero points.
        b16 = bias.bfloat16()
        out16 = quant_ops.gemm_int4(x.bfloat16(), pack_nibbles(q), s, z, b16).float()
        xq = x16
        if quant_ops.int8_activation_runs():
            runs = x16.view(rows, -1, 32)
            amax = runs.abs().amax(-1, keepdim=True)
            inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
            xq = (torch.round(runs * inv) * (amax / 127)).view(rows, k)
        ref = (xq.double() @ w.t().double() + b16.double()).float()
        torch.testing.assert_close(out16, ref, rtol=1e-2, atol=5e-3 * ref.abs().max().item())


def test_load_log_counts_an_int4_model_like_its_float_source(tiny_float, tmp_path, caplog):
    """The load line counts a linear layer by its logical [out, in] weight: an int4
    checkpoint has as many parameters as the float model it was made from (counting
    the packed bytes gave about a quarter)."""
    import logging
    import re

    from vllm.model_executor.model_loader import parameter_count
    path = write_gptq(tiny_float, str(tmp_path / "gptq"), 4, 32, False, True)
    float_model, _ = _engine_logits(tiny_float, _ids(_hf_tokenizer(tiny_float)))
    with caplog.at_level(logging.INFO, logger="vllm"):
        int4_model, _ = _engine_logits(path, _ids(_hf_tokenizer(tiny_float)))
    assert parameter_count(int4_model) == parameter_count(float_model)
    assert parameter_count(float_model) == sum(p.numel() for p in float_model.parameters())
    logged = re.search(r"([\d.]+) M parameters", caplog.text).group(1)
    assert logged == f"{parameter_count(float_model) / 1e6:.1f}"


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)
