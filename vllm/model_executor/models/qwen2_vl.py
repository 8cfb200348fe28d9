"""Qwen2-VL (Qwen2VLForConditionalGeneration): Qwen2.5-VL's design one generation back.

The language model, the M-RoPE positions, the processor and the frontend hooks are
Qwen2.5-VL's (qwen2_5_vl.py). The vision encoder differs:
- its width is `vision_config.embed_dim` (`hidden_size` is the language model's);
- LayerNorm (with bias) pre-norm blocks, a plain `fc1 -> act -> fc2` MLP of
  `embed_dim * mlp_ratio` (quick_gelu in the released configs);
- every block attends over the whole image (no windows), so the patches stay in the
  processor's order;
- the merger's norm is a LayerNorm too.
Patch embedding, the 2D rotary and the per-image / padded-and-masked attention layouts
are Qwen2.5-VL's. Weight names follow HF's Qwen2VisionTransformerPretrainedModel.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional, Sequence

import torch
from torch import nn

from vllm.model_executor.models.clip import vision_activation
from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from vllm.model_executor.models.qwen2_5_vl_vision import (AttnSegments,
                                                          Qwen2_5_VisionAttention,
                                                          Qwen2_5_VisionPatchEmbed,
                                                          Qwen2_5_VisionRotary, VisionInputs,
                                                          build_vision_inputs)

_WHOLE_IMAGE = 1 << 30
"""A window wider than any image: one window per frame, i.e. full attention."""


def _at_width(config: Any) -> SimpleNamespace:
    """The vision config with `hidden_size` meaning the encoder's width, as the shared
    Qwen2.5-VL pieces read it."""
    return SimpleNamespace(hidden_size=config.embed_dim, num_heads=config.num_heads,
                           in_channels=config.in_channels, patch_size=config.patch_size,
                           temporal_patch_size=config.temporal_patch_size)


class Qwen2VisionMLP(nn.Module):

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = vision_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Qwen2VisionBlock(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        width = config.embed_dim
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Qwen2_5_VisionAttention(_at_width(config))
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Qwen2VisionMLP(width, int(width * config.mlp_ratio), config.hidden_act)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                segments: AttnSegments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, segments)
        return x + self.mlp(self.norm2(x))


class Qwen2VisionPatchMerger(nn.Module):

    def __init__(self, out_dim: int, width: int, merge: int) -> None:
        super().__init__()
        self.merged = width * merge * merge
        self.ln_q = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.merged, self.merged), nn.GELU(),
                                 nn.Linear(self.merged, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged))


class Qwen2VisionTransformer(nn.Module):
    """Patches of one or more images -> their language-model tokens; the same
    `layout` / `forward(VisionInputs)` contract as Qwen2.5-VL's encoder."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.merge = config.spatial_merge_size
        self.patch_embed = Qwen2_5_VisionPatchEmbed(_at_width(config))
        rope = getattr(config, "rope_parameters", None) or {}
        self.rotary_pos_emb = Qwen2_5_VisionRotary(config.embed_dim // config.num_heads,
                                                   float(rope.get("rope_theta", 10000.0)))
        self.blocks = nn.ModuleList(Qwen2VisionBlock(config) for _ in range(config.depth))
        self.merger = Qwen2VisionPatchMerger(config.hidden_size, config.embed_dim, self.merge)

    def layout(self, pixel_values: Sequence[torch.Tensor], grids: Sequence[Sequence[int]],
               pad_to: Optional[int] = None) -> VisionInputs:
        return build_vision_inputs(pixel_values, grids, self.merge, _WHOLE_IMAGE, pad_to,
                                   self.merger.mlp[0].weight.device)

    def forward(self, inputs: VisionInputs) -> torch.Tensor:
        """[P / merge^2, hidden] merged tokens in image order (padding last)."""
        x = self.patch_embed(inputs.patches)
        rope = self.rotary_pos_emb(inputs.rope_positions)
        for block in self.blocks:
            x = block(x, rope, inputs.full)
        return self.merger(x).index_select(0, inputs.restore)


class Qwen2VLForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen2-VL's encoder in front of the Qwen2.5-VL language model and frontend."""

    vision_cls = Qwen2VisionTransformer
