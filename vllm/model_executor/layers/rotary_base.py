"""Rotary position embeddings (RoPE) with a precomputed cos/sin cache.

The cache holds `[cos | sin]` for every position up to `max_position`, computed in
float32 exactly as HF computes it on the fly (`positions * inv_freq`, then cos and
sin) and stored in the model dtype, so a forward pass only gathers rows by
position: no trigonometry and no per-token work in the hot loop.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """Plain RoPE ("default"): inv_freq[i] = base ** (-2i / rotary_dim).

    `is_neox_style=True` rotates the two halves of the rotary part (HF Llama's
    `rotate_half`); False rotates interleaved even/odd pairs (GPT-J style).
    Only the first `rotary_dim` features of each head are rotated.

    `forward(positions, query, key)` per platform (chosen once, see CustomOp):
    - CPU: the native kernel rotates query and key in place (one call when they are
      neighbouring views of a fused qkv projection) and returns them;
    - HPU: Gaudi's `apply_rotary_pos_emb` kernel on cos/sin gathered by position
      (vllm/hpu/ops.py, bound by the HPU plugin's `register_ops`);
    - elsewhere: `rotate` in torch (new tensors).
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool = True,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        if rotary_dim > head_size or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and <= head_size ({head_size}), got "
                             f"{rotary_dim}.")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        cache = self._compute_cos_sin_cache().to(dtype or torch.get_default_dtype())
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _compute_inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float()
        return 1.0 / (self.base ** (exponents / self.rotary_dim))

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = self._compute_inv_freq()
        t = torch.arange(self.max_position_embeddings, dtype=torch.float32,
                         device=inv_freq.device)
        freqs = torch.outer(t, inv_freq)
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate `query` [T, heads*head_size] and `key` [T, kv_heads*head_size] (or
        [T, heads, head_size]); returns tensors of the same shapes."""
        t = query.shape[0]
        q = self.rotate(positions, query.reshape(t, -1, self.head_size))
        k = self.rotate(positions, key.reshape(t, -1, self.head_size))
        return q.view(query.shape), k.view(key.shape)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Rotate every head of `x` [T, heads, head_size]; returns a new tensor.

        Computed as HF does, `x * cos + rotate_half(x) * sin`, with the sign of
        rotate_half folded into the sin table (see `_tables`).
        """
        cos, sin = self._tables(positions, x.dtype)
        rd = self.rotary_dim
        rot = x[..., :rd] if rd < self.head_size else x
        if self.is_neox_style:
            half = rd // 2
            swapped = torch.cat((rot[..., half:], rot[..., :half]), dim=-1)
        else:
            swapped = rot.unflatten(-1, (rd // 2, 2)).flip(-1).flatten(-2)
        out = torch.addcmul(rot * cos, swapped, sin)
        if rd < self.head_size:
            out = torch.cat((out, x[..., rd:]), dim=-1)
        return out

    def _tables(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [T, 1, rotary_dim], for these positions.

        Built once per forward pass (`_pass_cached`): every layer shares this module
        and receives the same `positions` tensor. Layout per head: neox `[c, c]` and
        `[-s, s]` (halves), GPT-J `[c0, c0, c1, c1, ...]` and `[-s0, s0, -s1, s1, ...]`.
        """
        return self._pass_cached(positions, dtype, self._build_tables)

    def _build_tables(self, positions: torch.Tensor,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        if self.is_neox_style:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
        else:
            cos = cos.repeat_interleave(2, dim=-1)
            sin = torch.stack((-sin, sin), dim=-1).flatten(-2)
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def _pass_cached(self, positions: torch.Tensor, dtype: torch.dtype,
                     build: Callable[[torch.Tensor, torch.dtype], tuple]) -> tuple:
        """`build(positions, dtype)`, once per forward pass (ForwardContext.rope_tables):
        later layers of the pass get the same tables. Outside a pass, and in traced
        code (where a Python-side cache would be a guard), built at every call."""
        ctx = None if torch.compiler.is_compiling() else get_forward_context()
        if ctx is None:
            return build(positions, dtype)
        hit = ctx.rope_tables.get(id(self))
        if hit is not None and hit[0] is positions and hit[1] == dtype:
            return hit[2]
        tables = build(positions, dtype)
        ctx.rope_tables[id(self)] = (positions, dtype, tables)
        return tables

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                f"max_position={self.max_position_embeddings}, base={self.base}, "
                f"neox={self.is_neox_style}")


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """Position interpolation ("linear"): every frequency divided by `factor`."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool, scaling_factor: float,
                 dtype: Optional[torch.dtype] = None) -> None:
        self.scaling_factor = scaling_factor
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                         dtype)

    def _compute_inv_freq(self) -> torch.Tensor:
        return super()._compute_inv_freq() / self.scaling_factor


class Llama3RotaryEmbedding(RotaryEmbedding):
    """Llama 3.1 frequency scaling ("llama3").

    Wavelengths shorter than `orig_max_position / high_freq_factor` are kept,
    those longer than `orig_max_position / low_freq_factor` are divided by
    `scaling_factor`, and the band between is interpolated smoothly.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool, scaling_factor: float,
                 low_freq_factor: float, high_freq_factor: float, orig_max_position: int,
                 dtype: Optional[torch.dtype] = None) -> None:
        self.scaling_factor = scaling_factor
        self.low_freq_factor = low_freq_factor
        self.high_freq_factor = high_freq_factor
        self.orig_max_position = orig_max_position
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                         dtype)

    def _compute_inv_freq(self) -> torch.Tensor:
        inv_freq = super()._compute_inv_freq()
        low_freq_wavelen = self.orig_max_position / self.low_freq_factor
        high_freq_wavelen = self.orig_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.scaling_factor,
                             inv_freq)
        smooth = ((self.orig_max_position / wavelen - self.low_freq_factor) /
                  (self.high_freq_factor - self.low_freq_factor))
        smoothed = (1 - smooth) * scaled / self.scaling_factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
