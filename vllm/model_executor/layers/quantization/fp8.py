"""`quant_method: fp8`: vLLM's FP8 format and online FP8 quantization.

- `--quantization fp8` on a float checkpoint: each linear weight is quantized to
  float8_e4m3fn right after loading, with one scale per tensor (vLLM's default) or
  per output channel (`VLLM_FP8_WEIGHT_SCALE=channel`); activations get a dynamic
  scale per token.
- A checkpoint whose config says `quant_method: fp8` (weights already fp8, a
  per-tensor `weight_scale`, and with `activation_scheme: static` an `input_scale`).
  With `weight_block_size` (DeepSeek's block-wise scales): fp8_block.py.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm import envs
from vllm.model_executor.kernels import kernel
from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig,
                                                                 all_or_none,
                                                                 check_field,
                                                                 checkpoint_names, make_param)
from vllm.model_executor.layers.quantization.fp8_scaled_mm import (Fp8GemmPlan,
                                                                   device_capability,
                                                                   plan_fp8_gemm)
from vllm.model_executor.layers.quantization.fp8_utils import (FP8_DTYPE, fp8_linear,
                                                               quantize_weight)


def on_hpu() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_hpu()


class Fp8Config(QuantizationConfig):
    name = "fp8"

    def __init__(self, serialized: bool, activation_scheme: str,
                 ignored_layers: list[str], per_channel: bool) -> None:
        self.serialized = serialized
        self.activation_scheme = activation_scheme
        self.ignored_layers = ignored_layers
        self.per_channel = per_channel

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8Config":
        online = bool(config.get("_online", False))
        scheme = check_field(config, "fp8", "activation_scheme", ("dynamic", "static"),
                             "dynamic")
        if online and scheme == "static":
            raise ValueError("quantization_config.activation_scheme='static' needs an fp8 "
                             "checkpoint with input scales.")
        if config.get("weight_block_size") is not None:
            # Block-fp8 checkpoints are Fp8BlockConfig's (chosen by the registry,
            # quantization/__init__.py); here only an online request can carry it.
            raise ValueError("quantization_config.weight_block_size needs a block-fp8 "
                             "checkpoint (weights with weight_scale_inv).")
        granularity = envs.VLLM_FP8_WEIGHT_SCALE
        if granularity not in ("tensor", "channel"):
            raise ValueError(f"VLLM_FP8_WEIGHT_SCALE={granularity!r}; use tensor or channel.")
        return cls(not online, scheme, list(config.get("ignored_layers") or []),
                   granularity == "channel")

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        ignored = [name in self.ignored_layers for name in checkpoint_names(prefix)]
        if all_or_none(prefix, self.name, ignored):
            return None
        if self.serialized:
            return Fp8CheckpointLinearMethod(per_channel=False,
                                             static_input=self.activation_scheme == "static")
        return Fp8OnlineLinearMethod(self.per_channel)

    def weight_summary(self) -> str:
        how = "checkpoint" if self.serialized else (
            "quantized at load, per-" + ("channel" if self.per_channel else "tensor"))
        return f"fp8 e4m3 ({how}; {self.activation_scheme} activation scales)"


def plan_layer(layer: nn.Module) -> Fp8GemmPlan:
    """The layer's GEMM plan (fp8_scaled_mm.py) for its final weights, stored on the
    layer: made once when the weights are processed, again only if they moved."""
    weight = layer.weight
    plan = layer.__dict__.get("fp8_gemm_plan")
    if plan is None or plan.device != weight.device:
        plan = plan_fp8_gemm(device_capability(weight.device), weight, layer.weight_scale)
        layer.fp8_gemm_plan = plan
    return plan


class Fp8LinearMethod(LinearMethodBase):
    """After processing: `weight` fp8 [N, K], `weight_scale` float32 [N], optional
    `input_scale` [1] (static activations), `fp8_gemm_plan` (how the GEMM runs)."""

    def __init__(self, weight_only: bool = False) -> None:
        self.on_hpu = on_hpu()
        self.gemm = kernel("fp8_gemm")  # the platform's (model_executor/kernels.py)
        self.weight_only = weight_only

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.weight_only:  # W8A16: activations stay in their dtype
            w = (layer.weight.float() * layer.weight_scale.unsqueeze(1)).to(x.dtype)
            return F.linear(x, w, bias)
        return fp8_linear(x, layer.weight, layer.weight_scale,
                          getattr(layer, "input_scale", None), bias, self.gemm,
                          plan_layer(layer))


class Fp8OnlineLinearMethod(Fp8LinearMethod):
    """Loads the float weight, then quantizes it (the float copy is freed)."""

    def __init__(self, per_channel: bool) -> None:
        super().__init__()
        self.per_channel = per_channel

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype) -> None:
        layer.weight = make_param((sum(output_partition_sizes), input_size_per_partition),
                                  params_dtype, 0, 1, layer.weight_loader)
        self.part_sizes = list(output_partition_sizes)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        w = layer.weight.data
        if self.per_channel:
            q, scale = quantize_weight(w, per_channel=True)
        else:  # one scale per merged part: q, k and v each keep their own range
            qs, scales = zip(*(quantize_weight(p, per_channel=False)
                               for p in w.split(self.part_sizes, 0)))
            q, scale = torch.cat(qs), torch.cat(scales)
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        layer.fp8_gemm_plan = None
        plan_layer(layer)


class Fp8CheckpointLinearMethod(Fp8LinearMethod):
    """fp8 weights as saved, with per-tensor (one per merged part) or per-channel
    scales; static activation scales are merged to their maximum (the parts of a
    fused layer share one input)."""

    def __init__(self, per_channel: bool, static_input: bool,
                 weight_only: bool = False) -> None:
        super().__init__(weight_only)
        self.per_channel = per_channel
        self.static_input = static_input

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype) -> None:
        n, parts = sum(output_partition_sizes), len(output_partition_sizes)
        self.part_sizes = list(output_partition_sizes)
        loader = layer.weight_loader
        layer.weight = make_param((n, input_size_per_partition), FP8_DTYPE, 0, 1, loader)
        if self.per_channel:
            layer.weight_scale = make_param((n, 1), torch.float32, 0, None, loader)
        else:
            layer.weight_scale = make_param((parts,), torch.float32, None, None, loader,
                                            fill=float("nan"), shard_indexed=True)
        if self.static_input:
            layer.input_scale = make_param((parts,), torch.float32, None, None, loader,
                                           fill=float("nan"), shard_indexed=True)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        scale = layer.weight_scale.data.float()
        if self.per_channel:
            scale = scale.reshape(-1)
        else:
            scale = torch.cat([s.expand(n) for s, n in zip(scale, self.part_sizes)])
        layer.weight_scale = nn.Parameter(scale.float().contiguous(), requires_grad=False)
        if self.static_input:
            layer.input_scale = nn.Parameter(layer.input_scale.data.amax().reshape(1),
                                             requires_grad=False)
        layer.fp8_gemm_plan = None
        if not self.weight_only:
            plan_layer(layer)
