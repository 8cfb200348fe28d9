"""FP8 KV cache: `--kv-cache-dtype fp8 | fp8_e4m3 | fp8_inc | fp8_e5m2`.

Reference: transformers on the same weights, attending to K (after the rotary
embedding) and V quantize-dequantized to fp8 with the same per-layer scales
(benchmarks/quantize_checkpoint.py:attach_fp8_kv, through transformers' attention
registry; the checkpoint's scales come from the compressed-tensors library's
`calculate_qparams`). Everything runs in float32. The engine and the reference then
differ by summation order, plus a K/V element whose scaled value sits on an fp8
rounding boundary may land on the other neighbour (one fp8 step, 1/8 of the element
for e4m3, once in a while). Greedy tokens must be identical; logprobs of the top-5
agree to 2e-3 (without such a flip they agree to ~1e-5).

The native decode kernel is also checked alone: against a float64 attention over the
dequantized cache, and on every fp8 code of both formats (its decoding table).
"""
from __future__ import annotations

import shutil

import pytest
import torch

from tests.engine.conftest import PROMPTS, hf_greedy
from tests.quantization._ckpt import float_dir, quantize_with_library, save_compressed

MAX_TOKENS = 10
LOGPROB_TOL = 2e-3
KV_BYTES = 32 << 20


@pytest.fixture(scope="module")
def tiny_float(tmp_path_factory) -> str:
    return float_dir(str(tmp_path_factory.mktemp("fp8kv")))


def _reference_runs(ref, tok) -> dict:
    """{prompt ids: (greedy tokens, per-step log-softmax)} of the reference on PROMPTS."""
    out = {}
    for p in PROMPTS:
        ids = tok.encode(p)
        out[tuple(ids)] = hf_greedy(ref, ids, MAX_TOKENS)
    return out


@pytest.fixture(scope="module")
def kv_ckpt(tiny_float, tmp_path_factory):
    """A float-weight checkpoint with fp8 KV scales (compressed-tensors kv_cache_scheme),
    and its reference's greedy runs (computed before saving)."""
    ref, tok = quantize_with_library(tiny_float, None, kv_cache=True)
    expected = _reference_runs(ref, tok)
    path = save_compressed(ref, tok, str(tmp_path_factory.mktemp("ckpt") / "kv"))
    return path, expected


def _run_engine(path: str, expected: dict, **kwargs):
    """Greedy tokens and top-5 logprobs against the reference's. `expected` maps prompt
    ids to one reference run, or to a list of acceptable ones (see
    test_fp8_weights_and_kv_checkpoint)."""
    from vllm import LLM
    llm = LLM(model=path, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=KV_BYTES, **kwargs)
    return _check_engine(llm, expected)


def _check_engine(llm, expected: dict):
    from vllm import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    ids = [list(k) for k in expected]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    for prompt, out in zip(ids, outs):
        runs = expected[tuple(prompt)]
        runs = runs if isinstance(runs, list) else [runs]
        tokens = list(out.outputs[0].token_ids)
        matching = [r for r in runs if r[0] == tokens]
        assert matching, f"prompt {prompt[:6]}: {tokens} vs {[r[0] for r in runs]}"
        for step, (lp_dict, ref) in enumerate(zip(out.outputs[0].logprobs, matching[0][1])):
            vals, tids = ref.topk(5)
            for tid, val in zip(tids.tolist(), vals.tolist()):
                assert tid in lp_dict, f"step {step}: token {tid} not in our top-5"
                assert abs(lp_dict[tid].logprob - val) < LOGPROB_TOL, (step, tid)
    return llm


def _runner(llm):
    return llm.llm_engine.engine_core.executor.worker.model_runner


@pytest.mark.parametrize("native", [True, False], ids=["native-ops", "torch-ops"])
def test_checkpoint_scales_match_reference(kv_ckpt, native, monkeypatch):
    """Scales from the checkpoint; decodes through the native kernel or torch ops."""
    monkeypatch.setenv("VLLM_CPU_NATIVE_OPS", "1" if native else "0")
    path, expected = kv_ckpt
    llm = _run_engine(path, expected, kv_cache_dtype="fp8")
    runner = _runner(llm)
    from safetensors import safe_open
    with safe_open(f"{path}/model.safetensors", "pt") as f:
        ck = {k: float(f.get_tensor(k)) for k in f.keys() if k.endswith(("k_scale", "v_scale"))}
    attn = runner.model.model.layers[1].self_attn.attn
    assert attn.k_scale == ck["model.layers.1.self_attn.k_scale"] != 1.0
    assert attn.v_scale == ck["model.layers.1.self_attn.v_scale"] != 1.0
    cache = runner.kv_caches[0]
    assert cache.dtype == torch.float8_e4m3fn
    # 1 byte per element: 4x the blocks of the float32 model's own cache dtype.
    cfg = runner.model_config
    per_block = (2 * cfg.get_num_layers() * runner.block_size * cfg.get_num_kv_heads()
                 * cfg.get_head_size())
    assert llm.llm_engine.vllm_config.cache_config.num_gpu_blocks == KV_BYTES // per_block
    llm.llm_engine.shutdown()


@pytest.mark.parametrize("cache_dtype", ["fp8_inc", "fp8_e5m2"])
def test_float_model_unit_scales_match_reference(tiny_float, cache_dtype):
    """A checkpoint without scales: 1.0 (e4m3 under its INC name, and e5m2)."""
    import transformers
    from benchmarks.quantize_checkpoint import attach_fp8_kv
    from vllm.attention.fp8_kv import KV_CACHE_DTYPES
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_float,
                                                            dtype=torch.float32).eval()
    attach_fp8_kv(ref, dtype=KV_CACHE_DTYPES[cache_dtype])
    tok = transformers.AutoTokenizer.from_pretrained(tiny_float)
    llm = _run_engine(tiny_float, _reference_runs(ref, tok), kv_cache_dtype=cache_dtype)
    assert _runner(llm).kv_caches[0].dtype == KV_CACHE_DTYPES[cache_dtype]
    llm.llm_engine.shutdown()


def test_fp8_weights_and_kv_checkpoint(tiny_float, tmp_path):
    """compressed-tensors FP8 weights and activations plus fp8 KV scales, together.

    The fp8 GEMM sums in another order than the reference's dequantized matmul, so a K
    element can sit on the other side of an fp8 rounding boundary. Measured: on
    "Translate to French..." the 4th token is a near tie in the reference (top two
    0.004 apart) and one such flip takes the other token; scaling the reference's KV
    scales by (1 - 1e-6) makes the reference itself produce the engine's tokens and
    logprobs. So a prompt may instead match the reference run with its scales scaled
    by (1 +- 1e-6), which moves exactly the elements that sit on a boundary (and only
    one prompt may need that)."""
    ref, tok = quantize_with_library(tiny_float, "FP8", kv_cache=True)
    state = ref.model.layers[0].self_attn._fp8_kv_state
    scales = dict(state["scales"])
    runs = []
    for eps in (0.0, 1e-6, -1e-6):
        state["scales"] = {k: v * (1 + eps) for k, v in scales.items()}
        runs.append(_reference_runs(ref, tok))
    state["scales"] = scales
    path = save_compressed(ref, tok, str(tmp_path / "fp8-kv"))
    expected = {p: [r[p] for r in runs] for p in runs[0]}
    _run_engine(path, expected, kv_cache_dtype="fp8").llm_engine.shutdown()
    assert sum(runs[0][p][0] != runs[1][p][0] or runs[0][p][0] != runs[2][p][0]
               for p in expected) <= 1


def test_fp8_cache_halves_block_bytes_of_bf16(tiny_float):
    from tests.models._model_helpers import make_vllm_config
    from vllm.cpu.model_runner import CPUModelRunner
    sizes = {}
    for cache_dtype in ("auto", "fp8"):
        cfg = make_vllm_config(tiny_float, dtype="bfloat16")
        cfg.cache_config.cache_dtype = cache_dtype
        runner = CPUModelRunner(cfg)
        sizes[cache_dtype] = runner.get_kv_cache_block_bytes()
        runner.initialize_kv_cache(4)
        assert runner.kv_caches[0].dtype == (torch.bfloat16 if cache_dtype == "auto"
                                             else torch.float8_e4m3fn)
    assert sizes["auto"] == 2 * sizes["fp8"]


def test_bad_kv_cache_dtype_is_refused():
    import argparse
    from vllm.config import CacheConfig
    from vllm.engine.arg_utils import EngineArgs
    for ok in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        CacheConfig(cache_dtype=ok)
    with pytest.raises(ValueError, match="kv_cache_dtype='int8'"):
        CacheConfig(cache_dtype="int8")
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(exit_on_error=False))
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--model", "m", "--kv-cache-dtype", "fp16"])
    assert parser.parse_args(["--model", "m", "--kv-cache-dtype", "fp8_inc"]).kv_cache_dtype \
        == "fp8_inc"


@pytest.mark.parametrize("field,value", [("strategy", "channel"), ("num_bits", 4),
                                         ("dynamic", True), ("type", "int")])
def test_bad_kv_cache_scheme_is_refused(field, value):
    from types import SimpleNamespace
    from vllm.model_executor.layers.quantization import build_quant_config
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
              "symmetric": True, field: value}
    hf = SimpleNamespace(quantization_config={"quant_method": "compressed-tensors",
                                              "config_groups": {}, "kv_cache_scheme": scheme})
    with pytest.raises(ValueError, match=f"kv_cache_scheme.{field}"):
        build_quant_config(None, hf)


@pytest.mark.parametrize("edit,match", [
    (("model.layers.1.self_attn.k_scale", torch.tensor(0.0)),
     r"model.layers.1.self_attn.k_scale=0.0 must be positive"),
    (("model.layers.0.self_attn.v_scale", torch.tensor([0.1, 0.2])),
     r"model.layers.0.self_attn.v_scale has shape \(2,\); only per-tensor"),
    (("model.layers.1.self_attn.v_scale", None), "no v_scale for layer 1"),
])
def test_bad_checkpoint_scales_fail_at_load(kv_ckpt, tmp_path, edit, match):
    from safetensors.torch import load_file, save_file
    from tests.models._model_helpers import make_vllm_config
    from vllm.model_executor.model_loader import get_model
    path = str(tmp_path / "bad")
    shutil.copytree(kv_ckpt[0], path)
    tensors = load_file(f"{path}/model.safetensors")
    name, value = edit
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    save_file(tensors, f"{path}/model.safetensors", metadata={"format": "pt"})
    cfg = make_vllm_config(path)
    cfg.cache_config.cache_dtype = "fp8"
    with pytest.raises(ValueError, match=match):
        get_model(cfg)


# ------------------------------------------------------------------ native kernel
def _native():
    from vllm.cpu import cpu_ops
    if not cpu_ops.supports(torch.float32):
        pytest.skip("native CPU kernels unavailable")
    return cpu_ops


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["e4m3", "e5m2"])
def test_native_kernel_decodes_every_fp8_code(fp8):
    """A one-token context returns V exactly: the kernel's table against torch's cast,
    for all 256 codes but the NaNs (and e5m2's infinities), times v_scale."""
    cpu_ops = _native()
    codes = torch.arange(256, dtype=torch.uint8)
    codes[~torch.isfinite(codes.view(fp8).float())] = 0
    kv_heads, d, hq = 2, 128, 4
    cache = torch.zeros(2, kv_heads, 16, d, dtype=torch.uint8)
    cache[1, :, 0] = codes.view(kv_heads, d)  # the V row of position 0 (block 0, slot 0)
    cache = cache.view(fp8)
    out = torch.empty(1, hq * d)
    v_scale = 0.375
    cpu_ops.decode_attention(torch.randn(1, hq * d), cache, torch.tensor([[0]], dtype=torch.int32),
                             torch.tensor([1], dtype=torch.int32), hq, 16, 0.1, out, 0.5,
                             v_scale)
    expected = (cache[1, :, 0].float() * v_scale).repeat_interleave(hq // kv_heads, 0)
    assert torch.equal(out, expected.reshape(1, -1))


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["e4m3", "e5m2"])
def test_native_kernel_matches_float64(fp8, q_dtype):
    """Paged decode over a random fp8 cache (GQA, scales != 1, ragged lengths) against
    float64 attention over the dequantized cache."""
    cpu_ops = _native()
    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, bs, blocks = 8, 2, 64, 16, 12
    cache = (torch.randn(2, hkv, blocks * bs, d, generator=gen) * 3).to(fp8)
    lens = torch.tensor([1, 17, 50, 131], dtype=torch.int32)
    table = torch.stack([torch.randperm(blocks, generator=gen)[:9] for _ in lens]).int()
    q = torch.randn(len(lens), hq * d, generator=gen).to(q_dtype)
    k_scale, v_scale, scale = 0.7, 1.9, d ** -0.5
    out = torch.empty(len(lens), hq * d, dtype=q_dtype)
    cpu_ops.decode_attention(q, cache, table, lens, hq, bs, scale, out, k_scale, v_scale)
    for i, n in enumerate(lens.tolist()):
        pos = torch.arange(n)
        slots = table[i, pos // bs].long() * bs + pos % bs
        k = cache[0][:, slots].double() * k_scale
        v = cache[1][:, slots].double() * v_scale
        qi = q[i].double().view(hkv, hq // hkv, d)
        p = torch.softmax(qi @ k.transpose(1, 2) * scale, -1)
        ref = (p @ v).reshape(-1)
        tol = 1e-5 if q_dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out[i].double(), ref, atol=tol * float(ref.abs().max()),
                                   rtol=0)


def test_calculate_kv_scales_matches_reference(tiny_float, monkeypatch):
    """--calculate-kv-scales: each layer's scales are max |k| / 200 and max |v| / 100 over
    the first forward pass (the reference takes K after the rotary embedding and V in
    transformers' attention on the same prompt, each layer's attention then reading them
    quantized, as the engine's does), then the cache holds K and V under them:
    greedy tokens and top-5 logprobs equal transformers attending to K/V
    quantize-dequantized with those scales."""
    import transformers
    from benchmarks.quantize_checkpoint import _KV_STATE, _fp8_kv_attention, attach_fp8_kv
    from vllm import LLM, SamplingParams
    from vllm.attention.layer import Attention
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_float,
                                                            dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tiny_float)
    attach_fp8_kv(ref)
    state = getattr(next(m for m in ref.modules() if hasattr(m, _KV_STATE)), _KV_STATE)
    first = tok.encode(PROMPTS[0])

    def calibrating(module, query, key, value, *args, **kwargs):
        # The layer's scales from this pass's K/V, then its attention already reads them
        # from the fp8 cache (so the next layer's input is what the engine's is).
        i = module.layer_idx
        state["scales"][(i, "k")] = float(key.abs().max()) / 200.0
        state["scales"][(i, "v")] = float(value.abs().max()) / 100.0
        return _fp8_kv_attention(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register("fp8_kv_calibrating", calibrating)
    ref.set_attn_implementation("fp8_kv_calibrating")
    with torch.no_grad():
        ref(torch.tensor([first]))
    ref.set_attn_implementation("fp8_kv_sdpa")
    expected = dict(state["scales"])

    # The prompt attended whole, like the reference: which prefill kernel runs is measured
    # at start-up (prefill_choice.py), and the row-wise one sums in another order; under
    # fp8 an element on a rounding boundary then lands a step apart in a later layer
    # (5e-3 in a logprob seen), so the test would depend on the machine's timings.
    from vllm.cpu import prefill_choice
    monkeypatch.setattr(prefill_choice, "choose_plan",
                        lambda *args: prefill_choice.PrefillPlan((prefill_choice.SDPA,) * 4))
    llm = LLM(model=tiny_float, dtype="float32", max_model_len=256, kv_cache_dtype="fp8",
              calculate_kv_scales=True, kv_cache_memory_bytes=KV_BYTES,
              enable_prefix_caching=False)
    layers = [m for m in _runner(llm).model.modules() if isinstance(m, Attention)]
    assert all(layer.calculate_kv_scales for layer in layers)
    llm.generate([{"prompt_token_ids": first}], SamplingParams(max_tokens=1),
                 use_tqdm=False)
    for layer in layers:
        assert not layer.calculate_kv_scales
        for part in ("k", "v"):
            got = getattr(layer, f"{part}_scale")
            # Layer 0 sees the same input as the reference's; a later layer's input has
            # been through fp8 attention, where an element on a rounding boundary may
            # land one fp8 step apart (see the module docstring): its maximum moves by
            # ~0.3%.
            rel = 1e-5 if layer.layer_idx == 0 else 1e-2
            assert got == pytest.approx(expected[(layer.layer_idx, part)], rel=rel)
    # The cache holds K/V under the scales it computed: the same tokens and logprobs as
    # the reference attending under the engine's scales.
    state["scales"] = {(layer.layer_idx, part): getattr(layer, f"{part}_scale")
                       for layer in layers for part in ("k", "v")}
    _check_engine(llm, _reference_runs(ref, tok))
    llm.llm_engine.shutdown()


def test_calculate_kv_scales_is_refused_without_fp8_cache_and_on_hpu(tiny_float):
    from vllm.config import CacheConfig
    with pytest.raises(ValueError, match="calculate_kv_scales.*fp8"):
        CacheConfig(calculate_kv_scales=True)
    from tests.hpu.conftest import make_llm, platform_env
    with platform_env("hpu"), pytest.raises(ValueError, match="not supported on HPU"):
        make_llm(model=tiny_float, kv_cache_dtype="fp8", calculate_kv_scales=True)
