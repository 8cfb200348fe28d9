"""Quantized linear layers: one config class per method (vLLM's names and formats).

| method | from | weights | CPU matmul | HPU matmul |
|---|---|---|---|---|
| fp8 | `--quantization fp8` on a bf16/fp32 checkpoint | float8_e4m3fn, per-tensor or per-channel scale, quantized at load | native fp8 kernel (else dequantize to the model dtype) | fp8 GEMM of the shim |
| compressed-tensors | checkpoint (`float-quantized` FP8, `pack-quantized` W4A16) | as saved | as fp8 / int4 | as fp8 / int4 |
| gptq, awq | checkpoint | int4 (gptq also int8) with group scales | native int4 kernel (else dequantize) | dequantize on the fly |
| inc | `--quantization inc` + QUANT_CONFIG (INC's json; inc.py) | MEASURE: float, records max-abs; QUANTIZE: fp8 with measured static scales | as fp8 (static input scale) | cast_to_fp8_v2 + fp8_gemm_v2 of the shim |
| gguf | a .gguf model | dequantized to float when converted | unquantized path | unquantized path |
| mxfp4 | checkpoint (GPT-OSS: MoE experts as `_blocks` + `_scales`) | experts dequantized to the model dtype at load (mxfp4.py) | unquantized path | unquantized path |

`build_quant_config(quantization, hf_config)` parses and validates everything at
engine start (a bad `quantization_config` fails there, naming the field). While
`get_model` builds the model it holds the config in `quant_config_scope`, and each
linear layer asks `current_quant_method(layer, prefix)` for its method: the models
need no quantization argument threaded through their constructors. The scope lives
exactly as long as the model construction.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator, Optional

from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig)

_CONFIGS = {"fp8": "fp8.Fp8Config", "gguf": "gguf.GGUFConfig",
            "compressed-tensors": "compressed_tensors.CompressedTensorsConfig",
            "gptq": "gptq.GPTQConfig", "awq": "awq.AWQConfig", "inc": "inc.IncConfig",
            "mxfp4": "mxfp4.Mxfp4Config"}
QUANTIZATION_METHODS = tuple(_CONFIGS)
"""Values of `--quantization` / `quantization_config.quant_method` this build runs."""

_CURRENT: list[Optional[QuantizationConfig]] = [None]


def _config_cls(method: str, qcfg: Optional[dict[str, Any]] = None
                ) -> type[QuantizationConfig]:
    """The config class of a method; an fp8 checkpoint with `weight_block_size` (e.g.
    DeepSeek-V3's) is block-fp8, a format of its own (fp8_block.py)."""
    name = _CONFIGS[method]
    if method == "fp8" and not (qcfg or {}).get("_online") \
            and (qcfg or {}).get("weight_block_size") is not None:
        name = "fp8_block.Fp8BlockConfig"
    module, cls = name.split(".")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def _checkpoint_method(qcfg: dict[str, Any]) -> str:
    method = qcfg.get("quant_method")
    if not isinstance(method, str):
        raise ValueError("quantization_config.quant_method is missing; supported: "
                         f"{', '.join(QUANTIZATION_METHODS)}.")
    method = method.lower().replace("_", "-")
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization_config.quant_method={qcfg.get('quant_method')!r} is "
                         f"not supported; supported: {', '.join(QUANTIZATION_METHODS)}.")
    return method


def build_quant_config(quantization: Optional[str],
                       hf_config: Any) -> Optional[QuantizationConfig]:
    """The config for `--quantization` and the checkpoint's `quantization_config`.

    A checkpoint's method wins when no flag is given; a flag that names another
    method than the checkpoint's is an error (as in vLLM).
    """
    if quantization is not None and quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization={quantization!r} is not supported; supported: "
                         f"{', '.join(QUANTIZATION_METHODS)}.")
    qcfg = getattr(hf_config, "quantization_config", None)
    if qcfg is not None and not isinstance(qcfg, dict):
        qcfg = qcfg.to_dict() if hasattr(qcfg, "to_dict") else dict(qcfg)
    if qcfg:
        method = _checkpoint_method(qcfg)
        if quantization not in (None, method):
            raise ValueError(f"quantization={quantization!r} does not match the checkpoint's "
                             f"quantization_config.quant_method={method!r}.")
        return _config_cls(method, qcfg).from_config(qcfg)
    if quantization is None:
        return None
    if quantization in ("gptq", "awq", "compressed-tensors", "mxfp4"):
        raise ValueError(f"quantization={quantization!r} needs a checkpoint saved in that "
                         "format (config.json has no quantization_config).")
    return _config_cls(quantization).from_config({"quant_method": quantization,
                                                  "_online": True})


@contextlib.contextmanager
def quant_config_scope(config: Optional[QuantizationConfig]) -> Iterator[None]:
    """Make `config` the one linear layers see while a model is constructed."""
    old = _CURRENT[0]
    _CURRENT[0] = config
    try:
        yield
    finally:
        _CURRENT[0] = old


def current_quant_method(layer: nn.Module, prefix: str) -> LinearMethodBase:
    """The linear method for the layer being built (unquantized outside a scope)."""
    from vllm.model_executor.layers.quantization.unquantized import UNQUANTIZED
    config = _CURRENT[0]
    if config is None:
        return UNQUANTIZED
    return config.get_quant_method(layer, prefix) or UNQUANTIZED


def process_weights_after_loading(model: nn.Module) -> None:
    """Let every layer's method repack what the checkpoint gave it (once, after load)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, LinearMethodBase):
            method.process_weights_after_loading(module)


__all__ = ["QUANTIZATION_METHODS", "QuantizationConfig", "LinearMethodBase",
           "build_quant_config", "current_quant_method", "process_weights_after_loading",
           "quant_config_scope"]
