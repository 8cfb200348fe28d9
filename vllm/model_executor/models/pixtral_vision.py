"""Pixtral vision encoder (Mistral 3's tower): native-resolution patches, 2D rotary.

An image of h x w patches (the processor resizes it to multiples of the patch size
within its longest edge) is cut into its h*w patches on the host, row-major, each
flattened channel-major (`patchify`): the patch convolution, whose kernel is the whole
patch, is then one matmul. The encoder:

1. embeds the patches and RMS-normalizes them (`ln_pre`);
2. rotates q/k with an axial rotary embedding: half of the head's frequencies follow
   the patch's row, half its column (the even-indexed base frequencies for rows, the
   odd ones for columns);
3. runs pre-norm blocks (RMSNorm, bidirectional attention that never crosses images,
   a gated MLP);
4. returns the states of `vision_feature_layer` (an index into [embeddings, block 1,
   ..., block N], or a list of them concatenated).

Images of one call are concatenated; attention runs per image, or (a fixed-shape
platform) as one masked attention over a padded patch count (`pad_to`), the same
result with shapes that depend only on the padded size. Weight names follow HF's
PixtralVisionModel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.clip import vision_activation


def patchify(image: torch.Tensor, patch: int) -> torch.Tensor:
    """[C, H, W] (multiples of `patch`) -> [H/p * W/p, C*p*p] patches, row-major, each
    flattened as the patch convolution's kernel is (channel, row, column)."""
    c, h, w = image.shape
    grid = image.reshape(c, h // patch, patch, w // patch, patch)
    return grid.permute(1, 3, 0, 2, 4).reshape((h // patch) * (w // patch), c * patch * patch)


@dataclass
class PixtralInputs:
    """One encoder call's patches, laid out on the host."""
    patches: torch.Tensor
    """[P, C*p*p]; padding rows are zeros."""
    positions: torch.Tensor
    """[P, 2] (row, column) of each patch in its image."""
    lengths: list[int]
    """Patches per image (then the padding, when padded)."""
    mask: Optional[torch.Tensor] = None
    """[1, 1, P, P] block-diagonal mask of `lengths` (the padded layout)."""


def build_pixtral_inputs(patches: Sequence[torch.Tensor], grids: Sequence[Sequence[int]],
                         pad_to: Optional[int] = None,
                         device: Optional[torch.device] = None) -> PixtralInputs:
    """Concatenate images' patches [h*w, dim] with (h, w) grids for one call."""
    x = torch.cat(list(patches))
    positions = torch.cat([torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w),
                                                      indexing="ij"), -1).reshape(-1, 2)
                           for h, w in grids])
    lengths = [h * w for h, w in grids]
    total = x.shape[0]
    mask = None
    if pad_to is not None:
        if pad_to < total:
            raise ValueError(f"pad_to ({pad_to}) is smaller than the patches ({total}).")
        if pad_to > total:
            x = torch.cat([x, x.new_zeros(pad_to - total, x.shape[1])])
            positions = torch.cat([positions, positions.new_zeros(pad_to - total, 2)])
            lengths = lengths + [pad_to - total]
        ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        mask = (ids[:, None] == ids[None, :])[None, None]
    device = device or x.device
    return PixtralInputs(x.to(device), positions.to(device), lengths,
                         None if mask is None else mask.to(device))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PixtralRotary(nn.Module):
    """Axial 2D rotary angles over the whole head."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq_rows", base[0::2].clone(), persistent=False)
        self.register_buffer("inv_freq_cols", base[1::2].clone(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [P, 1, head_dim] float32."""
        rows = positions[:, :1].float() * self.inv_freq_rows
        cols = positions[:, 1:].float() * self.inv_freq_cols
        half = torch.cat((rows, cols), dim=-1)
        emb = torch.cat((half, half), dim=-1)[:, None]
        return emb.cos(), emb.sin()


class PixtralAttention(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        width = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or width // self.num_heads
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(width, inner, bias=False)
        self.k_proj = nn.Linear(width, inner, bias=False)
        self.v_proj = nn.Linear(width, inner, bias=False)
        self.o_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                inputs: PixtralInputs) -> torch.Tensor:
        p = x.shape[0]
        q, k, v = (proj(x).view(p, self.num_heads, self.head_dim)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = rope
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, P, head_dim]
        if inputs.mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask)
        else:
            out = torch.cat([F.scaled_dot_product_attention(qs, ks, vs) for qs, ks, vs in zip(
                q.split(inputs.lengths, 2), k.split(inputs.lengths, 2),
                v.split(inputs.lengths, 2))], dim=2)
        return self.o_proj(out[0].transpose(0, 1).reshape(p, -1))


class PixtralMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act = vision_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PixtralBlock(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, eps=1e-5)
        self.attention = PixtralAttention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, eps=1e-5)
        self.feed_forward = PixtralMLP(config)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                inputs: PixtralInputs) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope, inputs)
        return x + self.feed_forward(self.ffn_norm(x))


class PixtralTransformer(nn.Module):

    def __init__(self, config: Any, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PixtralBlock(config) for _ in range(num_layers))


class PixtralVisionEncoder(nn.Module):
    """Patches of one or more images -> the feature layer's states [P, width * layers]."""

    def __init__(self, config: Any, feature_layer: Union[int, list[int]]) -> None:
        super().__init__()
        self.config = config
        self.patch_size = config.patch_size
        layers = list(feature_layer) if isinstance(feature_layer, (list, tuple)) \
            else [feature_layer]
        total = config.num_hidden_layers
        # Index into [embeddings, block 1, ..., block N] (HF's hidden_states).
        self.feature_layers = [i if i >= 0 else total + 1 + i for i in layers]
        if not all(0 <= i <= total for i in self.feature_layers):
            raise ValueError(f"vision_feature_layer {feature_layer!r} is outside the "
                             f"{total}-layer vision tower.")
        self.patch_conv = nn.Conv2d(config.num_channels, config.hidden_size,
                                    kernel_size=config.patch_size, stride=config.patch_size,
                                    bias=False)
        self.ln_pre = RMSNorm(config.hidden_size, eps=1e-5)
        # Blocks past the deepest feature layer never run: not built, not loaded.
        self.transformer = PixtralTransformer(config, max(self.feature_layers))
        rope = getattr(config, "rope_parameters", None) or {}
        head_dim = getattr(config, "head_dim", None) or \
            config.hidden_size // config.num_attention_heads
        self.rotary = PixtralRotary(head_dim, float(rope.get("rope_theta", 10000.0)))

    def owns_weight(self, name: str) -> bool:
        """Whether checkpoint tensor `name` (relative to the tower) belongs to a block
        this encoder builds."""
        parts = name.split(".")
        if parts[:2] == ["transformer", "layers"]:
            return int(parts[2]) < len(self.transformer.layers)
        return True

    def forward(self, inputs: PixtralInputs) -> torch.Tensor:
        weight = self.patch_conv.weight
        x = F.linear(inputs.patches.to(weight.dtype), weight.view(weight.shape[0], -1))
        x = self.ln_pre(x)
        rope = self.rotary(inputs.positions)
        states = [x]
        for block in self.transformer.layers:
            x = block(x, rope, inputs)
            states.append(x)
        return torch.cat([states[i] for i in self.feature_layers], dim=-1)
