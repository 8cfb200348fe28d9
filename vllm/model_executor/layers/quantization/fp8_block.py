"""Block-quantized FP8 checkpoints (DeepSeek-V3/R1's format): `quant_method: fp8` with
`weight_block_size: [128, 128]`.

Each quantized weight is float8_e4m3fn `[N, K]` with `weight_scale_inv` `[ceil(N / bn),
ceil(K / bk)]`: the float weight is `w_fp8 * scale_inv` block by block (a block at the
edge may be partial). Weights of every kind carry them, the experts' too.

The checkpoint is read through `convert_weights`: each `X.weight` is dequantized with its
`X.weight_scale_inv` as the tensors stream in (in float32, the same products the
reference computes), so the model receives float weights and loads, shards (TP,
experts) and absorbs them (MLA) as any float checkpoint:
- CPU: the layers run in the model dtype (dequantize-on-load);
- HPU: the linear layers re-quantize their weight to fp8 with one scale per output
  channel and run the shim's fp8 GEMM (`fp8_gemm_v2`), so the weights stay one byte
  each; experts (FusedMoE) and MLA's absorbed kv_b_proj keep the model dtype.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig,
                                                                 check_field)
from vllm.model_executor.layers.quantization.fp8_utils import FP8_DTYPE

SCALE_SUFFIX = ".weight_scale_inv"


def dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor,
                         block: tuple[int, int]) -> torch.Tensor:
    """float32 `[N, K]` of an fp8 weight and its per-block inverse scales."""
    n, k = weight.shape
    bn, bk = block
    expected = (math.ceil(n / bn), math.ceil(k / bk))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"weight_scale_inv of shape {tuple(scale_inv.shape)} does not match "
                         f"a [{n}, {k}] weight in {bn}x{bk} blocks (expected {expected}).")
    scale = scale_inv.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return weight.float() * scale


class Fp8BlockConfig(QuantizationConfig):
    name = "fp8"

    def __init__(self, block: tuple[int, int], ignored_layers: list[str]) -> None:
        self.block = block
        self.ignored_layers = ignored_layers

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8BlockConfig":
        check_field(config, "fp8", "activation_scheme", ("dynamic",), "dynamic")
        block = config.get("weight_block_size")
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(isinstance(b, int) and b > 0 for b in block)):
            raise ValueError("quantization_config.weight_block_size must be two positive "
                             f"integers, got {block!r}.")
        return cls((block[0], block[1]), list(config.get("ignored_layers") or []))

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        from vllm.platforms import current_platform
        if not current_platform.is_hpu() or prefix.endswith(("kv_b_proj", ".gate")):
            return None  # float weights (kv_b_proj: MLA absorbs it; the router: fp32 math)
        from vllm.model_executor.layers.quantization.fp8 import Fp8OnlineLinearMethod
        return Fp8OnlineLinearMethod(per_channel=True)

    def convert_weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                        ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors with every fp8 weight dequantized (its scale consumed);
        a weight waits for its scale (or the scale for its weight) when they come apart."""
        pending_w: dict[str, torch.Tensor] = {}
        pending_s: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            if name.endswith(SCALE_SUFFIX):
                base = name[:-len(SCALE_SUFFIX)]
                if base in pending_w:
                    yield f"{base}.weight", dequantize_block_fp8(pending_w.pop(base), tensor,
                                                                  self.block)
                else:
                    pending_s[base] = tensor
            elif name.endswith(".weight") and tensor.dtype == FP8_DTYPE:
                base = name[:-len(".weight")]
                if base in pending_s:
                    yield name, dequantize_block_fp8(tensor, pending_s.pop(base), self.block)
                else:
                    pending_w[base] = tensor
            else:
                yield name, tensor
        if pending_w or pending_s:
            missing = sorted(pending_w)[:3] or sorted(pending_s)[:3]
            raise ValueError(f"block-fp8 checkpoint: {len(pending_w)} fp8 weights without "
                             f"weight_scale_inv and {len(pending_s)} scales without a weight, "
                             f"e.g. {', '.join(missing)}.")

    def weight_summary(self) -> str:
        return (f"fp8 e4m3 in {self.block[0]}x{self.block[1]} blocks (dequantized at load; "
                "HPU: per-channel fp8 GEMM)")
