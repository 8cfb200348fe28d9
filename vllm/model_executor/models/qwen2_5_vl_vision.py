"""Qwen2.5-VL vision encoder: dynamic-resolution ViT with windowed attention.

The processor cuts an image into a (t, h, w) grid of patches (each patch holds
`temporal_patch_size` frames of `patch_size`^2 pixels: a still image is repeated in
time) and lists them merge-block by merge-block (`spatial_merge_size`^2 neighbouring
patches in a row). The encoder:

1. embeds each patch (a Conv3d whose kernel is the whole patch: a linear map);
2. rotates q/k with a 2D rotary embedding (half the frequencies follow the patch's
   row, half its column);
3. runs RMSNorm pre-norm blocks whose attention is local to windows of
   `window_size` pixels, except the `fullatt_block_indexes` blocks, which attend
   over the whole frame; attention never crosses images;
4. merges each block of merge-size^2 patches into one language-model token
   (`merger`: RMSNorm, then an MLP over the concatenated patches).

Windows are made contiguous by ordering the merge blocks window by window before
the blocks run (the host computes the order, `VisionInputs`) and restoring the
order after the merger. Attention runs per segment (window or frame) or, for a
fixed-shape platform, as one masked attention over a padded patch count
(`VisionInputs.pad_to`): the same result, with shapes that depend only on the
padded size. Weight names follow HF's Qwen2_5_VisionTransformerPretrainedModel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.clip import vision_activation


@dataclass
class AttnSegments:
    """Which patches attend to which: consecutive segment lengths, or (padded
    layout) a [1, 1, P, P] boolean mask of the same segments."""
    lengths: list[int]
    mask: Optional[torch.Tensor] = None


@dataclass
class VisionInputs:
    """One encoder call's inputs, laid out on the host (see the module docstring)."""
    patches: torch.Tensor
    """[P, C * T * patch * patch] pixel patches in window order (padding: zeros)."""
    rope_positions: torch.Tensor
    """[P, 2] (row, column) of each patch in its image grid, in window order."""
    full: AttnSegments
    window: AttnSegments
    restore: torch.Tensor
    """[P / merge^2] merged-token index in window order of each token in image order
    (padding tokens last)."""
    tokens_per_item: list[int]


def _window_order(t: int, gh: int, gw: int, window: int) -> tuple[np.ndarray, list[int]]:
    """(merge-block indices window by window, merge blocks per window) of one image
    whose merged grid is t x gh x gw; windows are window x window merge blocks, row
    by row, cut at the image's right and bottom edges."""
    index = np.arange(t * gh * gw).reshape(t, gh, gw)
    order, sizes = [], []
    for frame in range(t):
        for y in range(0, gh, window):
            for x in range(0, gw, window):
                block = index[frame, y:y + window, x:x + window].reshape(-1)
                order.append(block)
                sizes.append(block.size)
    return np.concatenate(order), sizes


def _grid_positions(t: int, h: int, w: int, merge: int) -> np.ndarray:
    """[t*h*w, 2] (row, column) of each patch in the processor's order: merge block by
    merge block, row-major inside each block, repeated per frame."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(np.stack([rows, cols], axis=-1), (t, 1))


def _segment_mask(lengths: list[int], device: torch.device) -> torch.Tensor:
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return (ids[:, None] == ids[None, :]).to(device)[None, None]


def build_vision_inputs(pixel_values: Sequence[torch.Tensor], grids: Sequence[Sequence[int]],
                        merge: int, window: int, pad_to: Optional[int] = None,
                        device: Optional[torch.device] = None) -> VisionInputs:
    """Lay out images (their processor patches [t*h*w, dim] and (t, h, w) grids) for
    one encoder call; `pad_to` patches (a multiple of merge^2) gives the masked,
    fixed-shape layout."""
    unit = merge * merge
    patches, positions, order = [], [], []
    full_lengths, window_lengths, tokens = [], [], []
    first_block = 0
    for pixels, (t, h, w) in zip(pixel_values, grids):
        gh, gw = h // merge, w // merge
        blocks, sizes = _window_order(t, gh, gw, window)
        rows = (blocks[:, None] * unit + np.arange(unit)).reshape(-1)
        patches.append(pixels[torch.from_numpy(rows)])
        positions.append(_grid_positions(t, h, w, merge)[rows])
        order.append(blocks + first_block)
        full_lengths += [h * w] * t
        window_lengths += [s * unit for s in sizes]
        tokens.append(t * gh * gw)
        first_block += t * gh * gw
    x = torch.cat(patches)
    pos = np.concatenate(positions)
    num = x.shape[0]
    if pad_to is not None and pad_to > num:
        x = torch.cat([x, x.new_zeros(pad_to - num, x.shape[1])])
        pos = np.concatenate([pos, np.zeros((pad_to - num, 2), dtype=pos.dtype)])
        full_lengths.append(pad_to - num)
        window_lengths.append(pad_to - num)
        order.append(np.arange(first_block, pad_to // unit))
    restore = np.argsort(np.concatenate(order), kind="stable")
    device = device or x.device
    full, win = AttnSegments(full_lengths), AttnSegments(window_lengths)
    if pad_to is not None:
        full.mask, win.mask = _segment_mask(full_lengths, device), _segment_mask(window_lengths,
                                                                                   device)
    return VisionInputs(patches=x.to(device), rope_positions=torch.from_numpy(pos).to(device),
                        full=full, window=win, restore=torch.from_numpy(restore).to(device),
                        tokens_per_item=tokens)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen2_5_VisionPatchEmbed(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        k = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.embed_dim = config.hidden_size
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=k, stride=k,
                              bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[P, C*T*p*p] -> [P, hidden]: the kernel covers the whole patch, so the
        convolution is one matmul with the flattened kernel."""
        weight = self.proj.weight
        return F.linear(patches.to(weight.dtype), weight.view(self.embed_dim, -1))


class Qwen2_5_VisionRotary(nn.Module):
    """2D rotary angles: a quarter of the head's frequencies per axis."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        dim = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [P, 1, head_dim] float32."""
        freqs = positions[..., None].float() * self.inv_freq.float()  # [P, 2, dim / 4]
        freqs = freqs.flatten(1)  # rows' frequencies, then columns'
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos(), emb.sin()


class Qwen2_5_VisionAttention(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                segments: AttnSegments) -> torch.Tensor:
        p = x.shape[0]
        q, k, v = self.qkv(x).view(p, 3, self.num_heads, self.head_dim).unbind(1)
        cos, sin = rope
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, P, head_dim]
        if segments.mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=segments.mask)
        else:
            out = torch.cat([F.scaled_dot_product_attention(qs, ks, vs) for qs, ks, vs in zip(
                q.split(segments.lengths, 2), k.split(segments.lengths, 2),
                v.split(segments.lengths, 2))], dim=2)
        return self.proj(out[0].transpose(0, 1).reshape(p, -1))


class Qwen2_5_VisionMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=True)
        self.up_proj = nn.Linear(h, i, bias=True)
        self.down_proj = nn.Linear(i, h, bias=True)
        self.act = vision_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Qwen2_5_VisionBlock(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.hidden_size, eps=1e-6)
        self.attn = Qwen2_5_VisionAttention(config)
        self.norm2 = RMSNorm(config.hidden_size, eps=1e-6)
        self.mlp = Qwen2_5_VisionMLP(config)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                segments: AttnSegments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, segments)
        return x + self.mlp(self.norm2(x))


class Qwen2_5_VisionPatchMerger(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        merged = config.hidden_size * config.spatial_merge_size ** 2
        self.merged = merged
        self.ln_q = RMSNorm(config.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(merged, merged), nn.GELU(),
                                 nn.Linear(merged, config.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged))


class Qwen2_5_VisionTransformer(nn.Module):
    """Patches of one or more images -> their language-model tokens (see the module
    docstring); `forward` takes a `VisionInputs`."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.merge = config.spatial_merge_size
        self.window = config.window_size // config.spatial_merge_size // config.patch_size
        if self.window < 1:
            raise ValueError(f"vision window_size {config.window_size} is smaller than one "
                             "merge block.")
        self.fullatt_block_indexes = set(config.fullatt_block_indexes)
        self.patch_embed = Qwen2_5_VisionPatchEmbed(config)
        rope = getattr(config, "rope_parameters", None) or {}
        self.rotary_pos_emb = Qwen2_5_VisionRotary(config.hidden_size // config.num_heads,
                                                   float(rope.get("rope_theta", 10000.0)))
        self.blocks = nn.ModuleList(Qwen2_5_VisionBlock(config) for _ in range(config.depth))
        self.merger = Qwen2_5_VisionPatchMerger(config)

    def layout(self, pixel_values: Sequence[torch.Tensor], grids: Sequence[Sequence[int]],
               pad_to: Optional[int] = None) -> VisionInputs:
        return build_vision_inputs(pixel_values, grids, self.merge, self.window, pad_to,
                                   self.merger.mlp[0].weight.device)

    def forward(self, inputs: VisionInputs) -> torch.Tensor:
        """[P / merge^2, out_hidden] merged tokens in image order (padding last)."""
        x = self.patch_embed(inputs.patches)
        rope = self.rotary_pos_emb(inputs.rope_positions)
        for i, block in enumerate(self.blocks):
            full = i in self.fullatt_block_indexes
            x = block(x, rope, inputs.full if full else inputs.window)
        return self.merger(x).index_select(0, inputs.restore)
