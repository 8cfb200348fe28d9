"""LongRoPE ("longrope", Phi-3/Phi-4 long-context configs).

Each frequency is divided by a per-dimension factor: `short_factor` for positions
below `original_max_position_embeddings`, `long_factor` from there on, and cos/sin
are multiplied by an attention factor (default `sqrt(1 + ln(s) / ln(orig))`, s =
max_position_embeddings / orig). The cache holds both halves, so the position picks
its own frequencies: as vLLM does. (transformers switches every position of a
sequence to the long factors once the sequence outgrows `orig`; the two agree for
sequences within `orig`.)
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from vllm.model_executor.layers.rotary_base import RotaryEmbedding


class Phi3LongRoPEScaledRotaryEmbedding(RotaryEmbedding):

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 original_max_position_embeddings: int, base: float, is_neox_style: bool,
                 short_factor: Sequence[float], long_factor: Sequence[float],
                 attention_factor: Optional[float] = None, factor: Optional[float] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
            if len(factors) != rotary_dim // 2:
                raise ValueError(f"longrope {name} needs rotary_dim / 2 = {rotary_dim // 2} "
                                 f"values, got {len(factors)}.")
        self.original_max_position_embeddings = original_max_position_embeddings
        self.short_factor = list(short_factor)
        self.long_factor = list(long_factor)
        if attention_factor is None:
            scale = factor or max_position_embeddings / original_max_position_embeddings
            attention_factor = (1.0 if scale <= 1.0 else math.sqrt(
                1 + math.log(scale) / math.log(original_max_position_embeddings)))
        self.attention_factor = float(attention_factor)
        super().__init__(head_size, rotary_dim, max(max_position_embeddings,
                                                    original_max_position_embeddings),
                         base, is_neox_style, dtype)

    def _inv_freq_with(self, factors: Sequence[float]) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float()
        ext = torch.tensor(factors, dtype=torch.float32)
        return 1.0 / (ext * self.base ** (exponents / self.rotary_dim))

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        orig = self.original_max_position_embeddings
        parts = []
        for factors, start, end in ((self.short_factor, 0, orig),
                                    (self.long_factor, orig, self.max_position_embeddings)):
            if end <= start:
                continue
            t = torch.arange(start, end, dtype=torch.float32)
            freqs = torch.outer(t, self._inv_freq_with(factors))
            parts.append(torch.cat((freqs.cos(), freqs.sin()), dim=-1) * self.attention_factor)
        return torch.cat(parts, dim=0)
