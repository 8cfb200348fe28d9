"""Dynamic NTK rotary scaling ("dynamic"), as vLLM computes it (InternLM2, older Llama
fine-tunes): one enlarged base for the whole extended context,

    base' = base * (factor * max_len / max_position - (factor - 1)) ** (dim / (dim - 2)),
    max_len = max_position * factor,

and a cos/sin table covering `max_len` positions. (transformers instead recomputes the
frequencies per sequence once it outgrows `max_position`; vLLM's fixed base is the
reference here, as everywhere the engines differ.)
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm.model_executor.layers.rotary_base import RotaryEmbedding


class DynamicNTKScalingRotaryEmbedding(RotaryEmbedding):

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool, scaling_factor: float,
                 dtype: Optional[torch.dtype] = None) -> None:
        if scaling_factor < 1.0:
            raise ValueError(f"dynamic rope scaling needs factor >= 1, got {scaling_factor}.")
        self.scaling_factor = scaling_factor
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                         dtype)

    @property
    def scaled_max_position(self) -> int:
        return int(self.max_position_embeddings * self.scaling_factor)

    def scaled_base(self) -> float:
        factor, dim = self.scaling_factor, self.rotary_dim
        ratio = factor * self.scaled_max_position / self.max_position_embeddings
        return self.base * (ratio - (factor - 1)) ** (dim / (dim - 2))

    def _compute_inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float()
        return 1.0 / (self.scaled_base() ** (exponents / self.rotary_dim))

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = self._compute_inv_freq()
        t = torch.arange(self.scaled_max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
