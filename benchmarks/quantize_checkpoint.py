"""Make a quantized checkpoint of a float HF model with the `compressed-tensors` library.

Round-to-nearest with the library's own scale computation (`calculate_qparams`) for
any of its preset schemes (FP8, FP8_DYNAMIC, W4A16, W4A16_ASYM, W8A16, ...); static
activation scales come from one calibration text. The returned model is the
library's quantize-dequantize (QDQ) simulation (the tests' reference); `save_compressed`
writes the compressed checkpoint the engine loads.

    python benchmarks/quantize_checkpoint.py MODEL_DIR OUT_DIR --scheme W4A16 --group-size 128
"""
from __future__ import annotations

import argparse
from typing import Optional

import torch

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


def quantize_with_library(float_dir: str, scheme: str, *, group_size: Optional[int] = None,
                          weight_strategy: Optional[str] = None, ignore=("lm_head",)):
    """(QDQ reference model, its tokenizer) for a compressed-tensors preset scheme."""
    import transformers
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
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
    return model.eval(), tok


def save_compressed(model, tok, out_dir: str) -> str:
    """Write `model` in the library's compressed format (config.json gets its
    quantization_config)."""
    from compressed_tensors.compressors import ModelCompressor
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--scheme", default="W4A16")
    parser.add_argument("--group-size", type=int, default=None)
    args = parser.parse_args()
    from vllm.config import resolve_model_path
    model, tok = quantize_with_library(resolve_model_path(args.model), args.scheme,
                                       group_size=args.group_size)
    print(save_compressed(model, tok, args.out))


if __name__ == "__main__":
    main()
