"""Build a model for this rank and fill it from a local HF-style checkpoint.

Parameters are created directly in the target dtype and on the target device
(default-dtype and device contexts), uninitialized, then each checkpoint tensor is
copied once into its (sharded) slice: no float32 model is ever materialized, no
random init is wasted, and safetensors files are read through mmap.
"""
from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import time
from typing import Any, Iterator, Union

import torch
from torch import nn

from vllm.attention.selector import attention_backend_scope, backend_cls_of
from vllm.model_executor.layers.fused_moe import expert_parallel_scope
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization import (process_weights_after_loading,
                                                     quant_config_scope)
from vllm.model_executor.layers.quantization.kv_cache import KVScales
from vllm.model_executor.models.registry import ModelRegistry

logger = logging.getLogger(__name__)

_SAFETENSORS_INDEX = "model.safetensors.index.json"
_PT_INDEX = "pytorch_model.bin.index.json"


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def get_model(vllm_config: Any, device: Union[str, torch.device] = "cpu") -> nn.Module:
    """The model of `vllm_config`, weights loaded, in eval mode, ready for inference."""
    model_config = vllm_config.model_config
    load_format = vllm_config.load_config.load_format
    model_cls, arch = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
    if getattr(model_config, "runner_type", "generate") == "pooling" and not getattr(
            model_cls, "is_pooling_model", False):
        from vllm.model_executor.models.adapters import as_embedding_model
        model_cls = as_embedding_model(model_cls)  # --convert embed
    start = time.perf_counter()
    quant_config = getattr(model_config, "quant_config", None)
    with (torch.no_grad(), _default_dtype(model_config.torch_dtype), torch.device(device),
          quant_config_scope(quant_config),
          attention_backend_scope(backend_cls_of(vllm_config)),
          expert_parallel_scope(getattr(getattr(vllm_config, "parallel_config", None),
                                        "enable_expert_parallel", False))):
        model = model_cls(vllm_config=vllm_config)
    load_weights_into(model, vllm_config, device)
    model.eval()
    logger.info("Loaded %s (%s) from %s in %.2f s (%s, %.1f M parameters, weights %.1f MiB"
                "%s)", arch, model_config.torch_dtype, model_config.model_path,
                time.perf_counter() - start, "dummy weights" if load_format == "dummy" else
                load_format, parameter_count(model) / 1e6,
                weight_bytes(model) / 2**20,
                f", {quant_config.weight_summary()}" if quant_config is not None else "")
    return model


def load_weights_into(model: nn.Module, vllm_config: Any,
                      device: Union[str, torch.device] = "cpu") -> None:
    """Fill the built model's parameters from the checkpoint (or the dummy init).

    Also what sleep mode's level 2 wake-up runs (vllm/worker/sleep_mode.py): the
    parameters are then empty tensors of their load-time shapes again, so the same
    checkpoint read and post-processing give the same values."""
    model_config = vllm_config.model_config
    load_format = vllm_config.load_config.load_format
    kv_scales = KVScales()
    with torch.no_grad(), torch.device(device):
        if load_format == "dummy":
            _init_dummy_weights(model, model_config.seed)
        else:
            if load_format == "mistral" or (load_format == "auto" and getattr(
                    model_config, "config_format", "hf") == "mistral"):
                from vllm.transformers_utils.mistral_format import iterate_mistral_weights
                raw = iterate_mistral_weights(model_config.model_path, model_config.hf_config)
            else:
                raw = iterate_weights(model_config.model_path, load_format)
            weights = kv_scales.filter(raw)
            convert = getattr(getattr(model_config, "quant_config", None), "convert_weights",
                              None)  # checkpoint formats read as float (fp8_block.py)
            model.load_weights(convert(weights) if convert is not None else weights)
        kv_scales.apply(model, vllm_config.cache_config.cache_dtype,
                        calculate=vllm_config.cache_config.calculate_kv_scales)
        process_weights_after_loading(model)


def parameter_count(model: nn.Module) -> int:
    """This rank's parameters as the checkpoint counts them: a linear layer counts its
    logical [out, in] weight (and bias), whatever form a quantization method turned the
    weight into (int4 nibbles packed in bytes, say, which `numel` would undercount);
    every other module its own parameters. Tied tensors count once."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, LinearBase):
            rows = getattr(module, "output_size_per_partition", module.output_size)
            cols = getattr(module, "input_size_per_partition", module.input_size)
            bias = getattr(module, "bias", None)
            total += rows * cols + (bias.numel() if bias is not None else 0)
            continue
        for param in module.parameters(recurse=False):
            if param.data_ptr() not in seen:
                seen.add(param.data_ptr())
                total += param.numel()
    return total


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (tied tensors once)."""
    seen: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
    return sum(seen.values())


def _init_dummy_weights(model: nn.Module, seed: int, low: float = -1e-3,
                        high: float = 1e-3) -> None:
    """Small uniform random weights (load_format='dummy': profiling, benchmarks)."""
    generators: dict[torch.device, torch.Generator] = {}  # one stream per device
    for param in model.parameters():
        device = param.device
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        values = torch.empty(param.shape, dtype=torch.float32, device=device)
        param.data.copy_(values.uniform_(low, high, generator=generators[device]))


def _files_from_index(model_path: str, index_name: str) -> list[str]:
    with open(os.path.join(model_path, index_name)) as f:
        weight_map = json.load(f)["weight_map"]
    return [os.path.join(model_path, name) for name in sorted(set(weight_map.values()))]


def _weight_files(model_path: str, load_format: str) -> tuple[str, list[str]]:
    """('safetensors' | 'pt', files) present in the directory, safetensors preferred."""
    if load_format in ("auto", "safetensors", "gguf"):
        if os.path.isfile(os.path.join(model_path, _SAFETENSORS_INDEX)):
            return "safetensors", _files_from_index(model_path, _SAFETENSORS_INDEX)
        files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
        if files:
            return "safetensors", files
    if load_format in ("auto", "pt"):
        if os.path.isfile(os.path.join(model_path, _PT_INDEX)):
            return "pt", _files_from_index(model_path, _PT_INDEX)
        files = sorted(glob.glob(os.path.join(model_path, "pytorch_model*.bin")))
        if files:
            return "pt", files
    raise ValueError(f"No weights for load_format={load_format!r} in {model_path}: expected "
                     "*.safetensors (or model.safetensors.index.json) or pytorch_model*.bin.")


def iterate_weights(model_path: str,
                    load_format: str = "auto") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, CPU tensor) for every tensor of the checkpoint, file by file."""
    kind, files = _weight_files(model_path, load_format)
    if kind == "safetensors":
        from safetensors import safe_open
        for path in files:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
    else:
        for path in files:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            yield from state.items()
            del state
