"""YaRN rotary scaling ("yarn"), as DeepSeek-V2/V3 configs ask for it.

Frequencies between the correction dimensions of `beta_fast` and `beta_slow`
rotations (over the original context) are blended linearly from extrapolated (kept)
to interpolated (divided by `factor`); cos and sin are multiplied by the attention
factor: `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both
are set (DeepSeek), else `get_mscale(factor)`, unless the config gives
`attention_factor`. The softmax scale's own `mscale_all_dim` correction belongs to
the attention (`yarn_softmax_scale`). Same float32 arithmetic as transformers.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from vllm.model_executor.layers.rotary_base import RotaryEmbedding


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_softmax_scale(scale: float, rope_scaling: Optional[dict[str, Any]]) -> float:
    """The attention scale with DeepSeek's YaRN correction (`mscale_all_dim` squared)."""
    if rope_scaling and rope_scaling.get("mscale_all_dim"):
        m = yarn_get_mscale(float(rope_scaling["factor"]), float(rope_scaling["mscale_all_dim"]))
        return scale * m * m
    return scale


class YaRNScalingRotaryEmbedding(RotaryEmbedding):

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool, scaling: dict[str, Any],
                 dtype: Optional[torch.dtype] = None) -> None:
        self.original_max_position = int(scaling["original_max_position_embeddings"])
        factor = scaling.get("factor")
        self.factor = float(factor if factor is not None
                            else max_position_embeddings / self.original_max_position)
        self.beta_fast = float(scaling.get("beta_fast") or 32)
        self.beta_slow = float(scaling.get("beta_slow") or 1)
        self.truncate = bool(scaling.get("truncate", True))
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attention_factor = (yarn_get_mscale(self.factor, mscale)
                                / yarn_get_mscale(self.factor, mscale_all)
                                if mscale and mscale_all else yarn_get_mscale(self.factor))
        self.attention_factor = float(attention_factor)
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                         dtype)

    def _correction_dim(self, rotations: float) -> float:
        dim = self.rotary_dim
        return (dim * math.log(self.original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(self.base)))

    def _compute_inv_freq(self) -> torch.Tensor:
        dim = self.rotary_dim
        low, high = self._correction_dim(self.beta_fast), self._correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        pos_freqs = self.base ** (torch.arange(0, dim, 2).float() / dim)
        extrapolation = 1 - ramp
        return (1.0 / (self.factor * pos_freqs)) * (1 - extrapolation) + \
            (1.0 / pos_freqs) * extrapolation

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        return super()._compute_cos_sin_cache() * self.attention_factor
