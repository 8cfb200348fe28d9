"""What every quantization method provides: a config and a per-layer linear method.

A `QuantizationConfig` is parsed once, at engine start, from the checkpoint's
`quantization_config` (config.json) or from `--quantization`. While the model is
built, each linear layer asks it for a `LinearMethodBase` (`get_quant_method`); that
object creates the layer's parameters (their names are the checkpoint's tensor
names, so the model's ordinary weight loading fills them), repacks them once after
loading (`process_weights_after_loading`) and computes the layer's output (`apply`)
on the current platform.

Parameters carry two attributes the linear layers' weight loaders read to shard
and to place merged (qkv, gate_up) parts: `output_dim` and `input_dim`, the tensor
dimension that runs along the layer's output / input features (None when the
tensor does not: a per-tensor scale). A dimension may hold the features packed
(8 int4 values per int32) or grouped (one scale per 128 inputs): the loaders place
parts by proportion, so every part's size must divide evenly, which the methods
check when they create the weights. A parameter with `shard_indexed=True` holds one
value per merged part (per-tensor scales of q, k and v): the loader writes part i
into element i; one with `per_part=True` holds one row per part (GPTQ's g_idx of q, k
and v), row i for part i.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn


def make_param(shape: tuple[int, ...], dtype: torch.dtype, output_dim: Optional[int],
               input_dim: Optional[int], weight_loader: Any, fill: Optional[float] = None,
               **attrs: Any) -> nn.Parameter:
    """A frozen parameter with the sharding attributes described above."""
    data = torch.empty(shape, dtype=dtype) if fill is None else torch.full(shape, fill,
                                                                          dtype=dtype)
    param = nn.Parameter(data, requires_grad=False)
    param.output_dim, param.input_dim = output_dim, input_dim
    param.weight_loader = weight_loader
    for key, value in attrs.items():
        setattr(param, key, value)
    return param


class LinearMethodBase:
    """How one linear layer stores and applies its weights."""

    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        """Register the layer's weight parameters (not the bias) on `layer`.

        `output_partition_sizes` lists this rank's output features of each merged
        part (one entry for a plain layer).
        """
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded checkpoint tensors into the layout `apply` reads."""

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError


class QuantizationConfig:
    """One quantization method's settings, read from a checkpoint or a flag."""

    name: str = ""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationConfig":
        """Parse the checkpoint's `quantization_config`; ValueError naming the field."""
        raise NotImplementedError

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        """The method for the linear layer at `prefix` (HF module name); None keeps it
        unquantized (an ignored layer)."""
        raise NotImplementedError

    def supported_act_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.bfloat16, torch.float16, torch.float32)

    def weight_summary(self) -> str:
        """How the weights are stored, for the load log."""
        return self.name


def check_field(config: dict[str, Any], method: str, field: str, allowed: Any,
                default: Any = None) -> Any:
    """config[field] (or `default` when absent), which must be one of `allowed`."""
    value = config.get(field, default)
    if value not in allowed:
        raise ValueError(f"quantization_config.{field}={value!r} is not supported for "
                         f"quant_method={method!r}; supported: "
                         f"{', '.join(repr(a) for a in allowed)}.")
    return value


def check_divisible(size: int, by: int, what: str, method: str, prefix: str) -> None:
    if by > 0 and size % by:
        raise ValueError(f"{method}: {what} ({size}) of layer {prefix} is not a multiple of "
                         f"{by}; this layer cannot be quantized with this method.")


FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
               "gate_up_proj": ("gate_proj", "up_proj")}
"""Fused layers of the models and the checkpoint modules they are made of (the
names quantization configs list in their ignore / target lists)."""


def checkpoint_names(prefix: str) -> list[str]:
    """The checkpoint module names a (possibly fused) layer stands for."""
    head, _, last = prefix.rpartition(".")
    parts = FUSED_PARTS.get(last)
    if parts is None:
        return [prefix]
    return [f"{head}.{p}" if head else p for p in parts]


def all_or_none(prefix: str, method: str, matches: list[bool]) -> bool:
    """A fused layer is quantized only if all its checkpoint modules are."""
    if any(matches) and not all(matches):
        raise ValueError(f"{method}: layer {prefix} fuses {', '.join(checkpoint_names(prefix))}"
                         ", which the checkpoint quantizes differently; this engine needs "
                         "them quantized alike.")
    return all(matches)
