"""Multimodal rotary embedding (M-RoPE) of Qwen2-VL / Qwen2.5-VL language models.

Each token has three positions (temporal, height, width: `positions` [3, T]). The
rotary frequencies are cut into `mrope_section` (t, h, w: sums to rotary_dim / 2)
and each section is rotated by its own row of positions. A text token has three
equal positions, so for text M-RoPE is plain RoPE; an image's tokens carry their
grid coordinates (vllm/multimodal/mrope.py computes them per request).
Qwen3-VL interleaves the rows instead (`mrope_interleaved`): frequency j follows the
height row when j % 3 == 1 and j < 3 * section[1], the width row when j % 3 == 2 and
j < 3 * section[2], and the temporal row otherwise.

Always the torch path: the platforms' rotary kernels take one position per token.
A [T] positions tensor is accepted too (text only: the three rows are equal).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.rotary_base import RotaryEmbedding


@CustomOp.register("mrotary_embedding")
class MRotaryEmbedding(RotaryEmbedding):
    """Neox-style RoPE whose frequency sections follow the t/h/w position rows."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, mrope_section: list[int],
                 dtype: Optional[torch.dtype] = None, mrope_interleaved: bool = False) -> None:
        if sum(mrope_section) != rotary_dim // 2:
            raise ValueError(f"mrope_section {mrope_section} must sum to rotary_dim / 2 = "
                             f"{rotary_dim // 2}.")
        self.mrope_section = list(mrope_section)
        self.mrope_interleaved = bool(mrope_interleaved)
        super().__init__(head_size, rotary_dim, max_position_embeddings, base,
                         is_neox_style=True, dtype=dtype)
        if self.mrope_interleaved:  # which position row each half-width frequency takes
            row = torch.zeros(rotary_dim // 2, dtype=torch.int64)
            for axis in (1, 2):
                row[axis:min(3 * mrope_section[axis], rotary_dim // 2):3] = axis
            self.register_buffer("_freq_row", row, persistent=False)

    def dispatch_forward(self) -> Callable[..., torch.Tensor]:
        """torch on every platform (the bound rotary kernels take [T] positions)."""
        return self.forward_native

    def _tables(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [T, 1, rotary_dim]: section i of the half-width
        tables gathered at position row i, then doubled neox-style."""
        if positions.dim() == 1:
            return super()._tables(positions, dtype)
        return self._pass_cached(positions, dtype, self._build_sectioned_tables)

    def _build_sectioned_tables(self, positions: torch.Tensor,
                                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.cos_sin_cache[positions]  # [3, T, rotary_dim]: [cos | sin] halves
        cos, sin = rows.chunk(2, dim=-1)
        if self.mrope_interleaved:
            h, w = self._freq_row == 1, self._freq_row == 2
            cos = torch.where(h, cos[1], torch.where(w, cos[2], cos[0]))
            sin = torch.where(h, sin[1], torch.where(w, sin[2], sin[0]))
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
            return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)
        cos = torch.cat([c[i] for i, c in enumerate(cos.split(self.mrope_section, -1))], -1)
        sin = torch.cat([s[i] for i, s in enumerate(sin.split(self.mrope_section, -1))], -1)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, mrope_section={self.mrope_section}, "
                f"interleaved={self.mrope_interleaved}")
