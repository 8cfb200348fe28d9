"""Make a quantized checkpoint of a float HF model with the `compressed-tensors` library.

Round-to-nearest with the library's own scale computation (`calculate_qparams`) for
any of its preset schemes (FP8, FP8_DYNAMIC, W4A16, W4A16_ASYM, W8A16, ...); static
activation scales come from one calibration text. `--kv-cache` adds an fp8 KV cache
scheme: static per-tensor `k_scale` / `v_scale` per attention layer (the library's
`kv_cache_scheme` config and `calculate_qparams` over the absolute maximum of the
post-rotary K and of V on the same text), and the returned model then quantize-
dequantizes K and V as the cache would (`attach_fp8_kv`). compressed-tensors 0.20 finds
the attention modules to hook by a `past_key_values` argument that transformers 5
renamed `cache`, so the K/V side is done here, through transformers' attention-function
registry, which sees every layer's full K/V after the cache update. `--scheme none`
quantizes only the KV cache. The returned model is the
library's quantize-dequantize (QDQ) simulation (the tests' reference); `save_compressed`
writes the compressed checkpoint the engine loads.

    python benchmarks/quantize_checkpoint.py MODEL_DIR OUT_DIR --scheme W4A16 --group-size 128

`--method gptq` (or `rtn`, the same grid without error compensation) writes a GPTQ
checkpoint instead, with the project's own GPTQ (benchmarks/gptq.py), calibrated on
vllm/benchmarks/data/corpus.txt (never on the perplexity text, heldout.txt); GPTQ's format
also takes group sizes that do not divide a layer's input size (a shorter last group),
which compressed-tensors refuses:

    python benchmarks/quantize_checkpoint.py HuggingFaceTB/SmolLM2-135M-Instruct \
        /tmp/smollm2-gptq-g128 --method gptq --group-size 128 --act-order --mse-clip
"""
from __future__ import annotations

import argparse
import os
from typing import Optional

import torch

from vllm.benchmarks.datasets import CORPUS_PATH as CORPUS

CALIBRATION_TEXT = ("The tower is 324 metres tall, about the same height as an 81-storey "
                    "building, and the tallest structure in Paris.")


def _weight_range(weight: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.float()
    if args.strategy == "tensor":
        return w.min().reshape(1), w.max().reshape(1)
    if args.strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    g = w.reshape(w.shape[0], -1, args.group_size)
    return g.amin(-1), g.amax(-1)


def quantize_with_library(float_dir: str, scheme: Optional[str], *,
                          group_size: Optional[int] = None,
                          weight_strategy: Optional[str] = None, ignore=("lm_head",),
                          kv_cache: bool = False):
    """(QDQ reference model, its tokenizer) for a compressed-tensors preset scheme (None:
    float weights), with an fp8 KV cache scheme when `kv_cache`."""
    import transformers
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 apply_quantization_config,
                                                 preset_name_to_scheme)
    from compressed_tensors.quantization.utils import calculate_qparams

    model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(float_dir)
    amax: dict[str, float] = {}

    def record(name):
        def hook(module, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
        return hook

    hooks = [m.register_forward_pre_hook(record(n)) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        model(tok(CALIBRATION_TEXT, return_tensors="pt").input_ids)
    for h in hooks:
        h.remove()
    if scheme is not None:
        sch = preset_name_to_scheme(scheme, ["Linear"])
        if group_size is not None:
            sch.weights.group_size = group_size
        if weight_strategy is not None:
            sch.weights.strategy = weight_strategy
        apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": sch},
                                                            ignore=list(ignore)))
    with torch.no_grad():
        for name, module in model.named_modules():
            s = getattr(module, "quantization_scheme", None)
            if s is None:
                continue
            mn, mx = _weight_range(module.weight, s.weights)
            scale, zp = calculate_qparams(mn, mx, s.weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zp.reshape(module.weight_zero_point.shape))
            ia = s.input_activations
            if ia is not None and not ia.dynamic:
                v = torch.tensor([amax[name]])
                scale, _ = calculate_qparams(-v, v, ia)
                module.input_scale.copy_(scale.reshape(module.input_scale.shape))
    if kv_cache:
        kv_args = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False,
                                   symmetric=True)
        attach_fp8_kv(model, calibrate=(tok, kv_args))
    return model.eval(), tok


_KV_STATE = "_fp8_kv_state"


def _fp8_kv_attention(module, query, key, value, *args, **kwargs):
    """transformers attention function: the SDPA one on K/V as an fp8 cache holds them
    (or, while calibrating, recording their absolute maximum)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    state = getattr(module, _KV_STATE)
    i = module.layer_idx
    if state["amax"] is not None:
        for part, x in (("k", key), ("v", value)):
            state["amax"][(i, part)] = max(state["amax"].get((i, part), 0.0),
                                           float(x.abs().max()))
    else:
        key = _qdq(key, state["scales"][(i, "k")], state["dtype"])
        value = _qdq(value, state["scales"][(i, "v")], state["dtype"])
    return sdpa_attention_forward(module, query, key, value, *args, **kwargs)


def _qdq(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    fmax = float(torch.finfo(dtype).max)
    return ((x.float() / scale).clamp(-fmax, fmax).to(dtype).float() * scale).to(x.dtype)


@torch.no_grad()
def attach_fp8_kv(model, calibrate=None, dtype: torch.dtype = torch.float8_e4m3fn) -> dict:
    """Make `model` (transformers) attend to K/V quantize-dequantized to fp8 `dtype`.

    Scales per layer: 1.0, or with `calibrate=(tokenizer, QuantizationArgs)` the
    library's `calculate_qparams` over the calibration text's K/V range. Returns
    {(layer, 'k' | 'v'): scale}, also kept on the model for `save_compressed`."""
    from transformers import AttentionInterface
    AttentionInterface.register("fp8_kv_sdpa", _fp8_kv_attention)
    attns = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "k_proj")]
    state = {"amax": {} if calibrate else None, "scales": {}, "dtype": dtype}
    for m in attns:
        setattr(m, _KV_STATE, state)
    model.set_attn_implementation("fp8_kv_sdpa")
    if calibrate:
        from compressed_tensors.quantization.utils import calculate_qparams
        tok, kv_args = calibrate
        model(tok(CALIBRATION_TEXT, return_tensors="pt").input_ids)
        for key, amax in state["amax"].items():
            v = torch.tensor([amax])
            state["scales"][key] = float(calculate_qparams(-v, v, kv_args)[0].reshape(()))
        state["amax"] = None
        model._fp8_kv_scheme = kv_args.model_dump(mode="json")
    else:
        state["scales"] = {(m.layer_idx, p): 1.0 for m in attns for p in ("k", "v")}
    return state["scales"]


def save_compressed(model, tok, out_dir: str) -> str:
    """Write `model` in the library's compressed format (config.json gets its
    quantization_config)."""
    from compressed_tensors.compressors import ModelCompressor
    compressor = ModelCompressor.from_pretrained_model(model)
    if compressor is not None:
        compressor.compress_model(model)
    model.save_pretrained(out_dir)
    if compressor is not None:
        compressor.update_config(out_dir)
    tok.save_pretrained(out_dir)
    if getattr(model, "_fp8_kv_scheme", None) is not None:
        _save_kv_scales(model, out_dir)
    return out_dir


def _save_kv_scales(model, out_dir: str) -> None:
    """Add `model.layers.N.self_attn.{k,v}_scale` (the names llm-compressor writes) and
    `quantization_config.kv_cache_scheme` to a saved checkpoint."""
    import json
    import os
    from safetensors.torch import load_file, save_file
    state = next(getattr(m, _KV_STATE) for m in model.modules() if hasattr(m, _KV_STATE))
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    for (i, part), scale in state["scales"].items():
        tensors[f"model.layers.{i}.self_attn.{part}_scale"] = torch.tensor(scale)
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    qcfg = cfg.setdefault("quantization_config", {"quant_method": "compressed-tensors",
                                                  "format": "dense", "config_groups": {}})
    qcfg["kv_cache_scheme"] = model._fp8_kv_scheme
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)



def calibration_batches(tok, path: str = CORPUS, seq_len: int = 512,
                        max_tokens: int = 4096) -> list[torch.Tensor]:
    """The calibration text (comment and section lines dropped) as token sequences of
    `seq_len`, at most `max_tokens` tokens in all."""
    with open(path) as f:
        text = "\n".join(ln for ln in f.read().splitlines()
                         if not ln.startswith("#") and not ln.startswith("["))
    ids = torch.tensor(tok(text).input_ids[:max_tokens])
    return [ids[i:i + seq_len] for i in range(0, len(ids), seq_len) if len(ids[i:i + seq_len]) > 1]


def quantize_gptq(float_dir: str, out_dir: str, method: str, args) -> str:
    """GPTQ (or RTN on GPTQ's grid) of every decoder linear, written as a GPTQ checkpoint."""
    import transformers

    from benchmarks.gptq import GPTQArgs, quantize_model, save_gptq
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(float_dir)
    gargs = GPTQArgs(bits=args.bits, group_size=args.group_size or 128, sym=args.sym,
                     act_order=args.act_order, damp=args.damp, mse_clip=args.mse_clip,
                     true_sequential=args.true_sequential, static_groups=args.static_groups)
    batches = calibration_batches(tok, args.calibration, max_tokens=args.calibration_tokens)
    print(f"{method}: {sum(len(b) for b in batches)} calibration tokens of "
          f"{os.path.basename(args.calibration)}, {gargs}", flush=True)
    quantized = quantize_model(model.eval(), batches, gargs, method=method)
    save_gptq(float_dir, out_dir, quantized, gargs)
    tok.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--method", choices=("library", "gptq", "rtn"), default="library",
                        help="library: compressed-tensors round-to-nearest (--scheme); "
                             "gptq / rtn: a GPTQ checkpoint (--bits, --group-size, --sym, "
                             "--act-order)")
    parser.add_argument("--scheme", default="W4A16")
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--kv-cache", action="store_true",
                        help="also an fp8 KV cache scheme (k_scale / v_scale per layer)")
    parser.add_argument("--bits", type=int, choices=(4, 8), default=4)
    parser.add_argument("--sym", action="store_true", help="gptq/rtn: symmetric grid")
    parser.add_argument("--act-order", action="store_true",
                        help="gptq: columns in decreasing Hessian diagonal order (desc_act)")
    parser.add_argument("--damp", type=float, default=0.01)
    parser.add_argument("--mse-clip", action="store_true",
                        help="gptq/rtn: each group's range shrunk to the least squared error")
    parser.add_argument("--static-groups", action="store_true",
                        help="gptq: group grids from the original weights, groups in input "
                             "order even with --act-order (no permutation at run time)")
    parser.add_argument("--true-sequential", action="store_true",
                        help="gptq: a layer's linears one stage after another (qkv, o, "
                             "gate/up, down), each calibrated through the quantized ones")
    parser.add_argument("--calibration", default=CORPUS)
    parser.add_argument("--calibration-tokens", type=int, default=4096)
    args = parser.parse_args()
    from vllm.transformers_utils.config import resolve_model_path
    if args.method != "library":
        if args.kv_cache or args.scheme != "W4A16":
            raise SystemExit("--kv-cache and --scheme belong to --method library.")
        print(quantize_gptq(resolve_model_path(args.model), args.out, args.method, args))
        return
    scheme = None if args.scheme.lower() == "none" else args.scheme
    model, tok = quantize_with_library(resolve_model_path(args.model), scheme,
                                       group_size=args.group_size, kv_cache=args.kv_cache)
    print(save_compressed(model, tok, args.out))


if __name__ == "__main__":
    main()
