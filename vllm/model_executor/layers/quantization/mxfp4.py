"""MXFP4 checkpoints (`quantization_config.quant_method == "mxfp4"`, GPT-OSS's published
weights): the MoE experts' weights are stored as `<name>_blocks` (uint8 [..., out, in /
32, 16], two FP4 e2m1 values per byte, the low nibble first) and `<name>_scales` (uint8
[..., out, in / 32], e8m0: the power of two `scale - 127` of each block of 32 values);
every other layer is in the model dtype (`modules_to_not_convert`).

This build dequantizes the experts to the model dtype while loading (`dequantize_mxfp4`,
called by the model's loader per expert), so every platform runs its ordinary MoE
path; the config therefore quantizes no linear layer. A native MXFP4 expert GEMM is
not implemented.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig)

FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                   -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 values of an FP4 e2m1 code (sign bit 3, exponent bits 1-2, mantissa bit 0)."""
MXFP4_BLOCK = 32
"""Values sharing one e8m0 scale."""
E8M0_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[..., rows, groups, 16] uint8 blocks + [..., rows, groups] uint8 scales ->
    [..., rows, groups * 32] in `dtype`: each FP4 value times its block's power of
    two."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}.")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not fit scales "
                         f"{tuple(scales.shape)} (expected blocks [..., groups, "
                         f"{MXFP4_BLOCK // 2}] and scales [..., groups]).")
    # Exact in bfloat16 (3 significant bits times a power of two, float32's exponent
    # range); other dtypes round once, from float32.
    work = dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32
    values = _byte_pairs(work, blocks.device).index_select(0, blocks.reshape(-1).int())
    values = values.view(*blocks.shape[:-1], MXFP4_BLOCK)          # [..., groups, 32]
    scale = torch.exp2(scales.float() - E8M0_BIAS).to(work)
    return (values * scale.unsqueeze(-1)).flatten(-2).to(dtype)


def _byte_pairs(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 2]: the two FP4 values of each byte, low nibble first (one gather per byte
    instead of one per value: ~3x faster than decoding nibbles)."""
    lut = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32)
    byte = torch.arange(256)
    return torch.stack((lut[byte & 0x0F], lut[byte >> 4]), dim=-1).to(dtype=dtype,
                                                                       device=device)


class Mxfp4Config(QuantizationConfig):
    name = "mxfp4"

    def __init__(self, modules_to_not_convert: Optional[list[str]] = None) -> None:
        self.modules_to_not_convert = list(modules_to_not_convert or [])

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Mxfp4Config":
        if config.get("_online"):
            raise ValueError("quantization='mxfp4' needs a checkpoint saved in that format "
                             "(config.json has no quantization_config).")
        skip = config.get("modules_to_not_convert")
        if skip is not None and not isinstance(skip, (list, tuple)):
            raise ValueError("quantization_config.modules_to_not_convert must be a list.")
        return cls(skip)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        return None  # experts are dequantized at load; linear layers are not quantized

    def weight_summary(self) -> str:
        return "mxfp4 experts dequantized at load"

    def __repr__(self) -> str:
        return "Mxfp4Config(experts dequantized at load)"
