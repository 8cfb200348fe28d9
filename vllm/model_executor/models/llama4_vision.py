"""Llama 4's vision encoder and adapter: square tiles -> language-model tokens.

Each tile (image_size pixels a side) is cut into patches by an unfold and a linear map; a
class token joins the patches at the end, learned positions are added, and LayerNorm
pre-norm blocks attend bidirectionally within the tile, q/k rotated by a 2D rotary
(interleaved pairs: a quarter-head of frequencies follows the patch's column + 1, the
other its row + 1; the class token is not rotated). After the post-norm the class token
is dropped, a pixel shuffle folds each `1 / ratio` x `1 / ratio` patch square into one
token (channels x 1 / ratio^2) and a two-layer GELU MLP (`vision_adapter`) maps it; the
model's projector then maps it into the language model's width. Weight names follow
HF's Llama4VisionModel.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def pixel_shuffle(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """[N, P, C] patches of a square grid -> [N, P * ratio^2, C / ratio^2]: each
    1/ratio x 1/ratio square of patches becomes one token (as the reference folds the
    columns, then the rows)."""
    n, p, c = x.shape
    side = int(round(p ** 0.5))
    x = x.view(n, side, side, c)
    x = x.reshape(n, side, int(side * ratio), int(c / ratio)).permute(0, 2, 1, 3)
    x = x.reshape(n, int(side * ratio), int(side * ratio), int(c / ratio ** 2))
    return x.permute(0, 2, 1, 3).reshape(n, -1, int(c / ratio ** 2))


def vision_rotary(config: Any) -> torch.Tensor:
    """[patches + 1, head_dim / 2] complex rotations (the class token's: 1)."""
    side = config.image_size // config.patch_size
    head_dim = config.hidden_size // config.num_attention_heads
    freq_dim = head_dim // 2
    theta = float((getattr(config, "rope_parameters", None) or {}).get(
        "rope_theta", getattr(config, "rope_theta", 10000.0)))
    base = 1.0 / (theta ** (torch.arange(0, freq_dim, 2)[:freq_dim // 2].float() / freq_dim))
    idx = torch.arange(side * side)
    cols, rows = (idx % side + 1).float(), (idx // side + 1).float()
    angles = torch.cat([cols[:, None] * base, rows[:, None] * base], dim=-1)
    angles = torch.cat([angles, torch.zeros(1, angles.shape[1])])  # the class token
    return torch.polar(torch.ones_like(angles), angles)


class Llama4VisionAttention(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        h = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(h, h) for _ in range(3))
        self.o_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(n, t, self.num_heads, self.head_dim)

        def rotate(y: torch.Tensor) -> torch.Tensor:
            pairs = torch.view_as_complex(y.float().reshape(n, t, self.num_heads, -1, 2))
            return torch.view_as_real(pairs * rotary[None, :, None]).flatten(3).to(y.dtype)

        q, k, v = rotate(heads(self.q_proj)), rotate(heads(self.k_proj)), heads(self.v_proj)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).reshape(n, t, -1))


class Llama4VisionMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Llama4VisionEncoderLayer(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size)
        self.self_attn = Llama4VisionAttention(config)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size)
        self.mlp = Llama4VisionMLP(config)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama4VisionEncoder(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Llama4VisionEncoderLayer(config)
                                    for _ in range(config.num_hidden_layers))


class Llama4UnfoldConvolution(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.patch = config.patch_size
        self.linear = nn.Linear(config.num_channels * self.patch ** 2, config.hidden_size,
                                bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[N, C, S, S] -> [N, patches, hidden] (patches row-major, each channel-major)."""
        cols = F.unfold(pixels, kernel_size=self.patch, stride=self.patch)
        return self.linear(cols.transpose(1, 2))


class Llama4VisionAdapterMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.intermediate_size, config.projector_input_dim, bias=False)
        self.fc2 = nn.Linear(config.projector_output_dim, config.projector_output_dim,
                             bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc2(F.gelu(self.fc1(x))))


class Llama4VisionPixelShuffleMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.ratio = config.pixel_shuffle_ratio
        self.mlp = Llama4VisionAdapterMLP(config)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.mlp(pixel_shuffle(patches, self.ratio))


class Llama4VisionModel(nn.Module):
    """[tiles, C, S, S] -> [tiles, tokens per tile, projector_output_dim]."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        patches = (config.image_size // config.patch_size) ** 2
        self.patch_embedding = Llama4UnfoldConvolution(config)
        self.class_embedding = nn.Parameter(torch.empty(hidden), requires_grad=False)
        self.positional_embedding_vlm = nn.Parameter(torch.empty(patches + 1, hidden),
                                                     requires_grad=False)
        self.layernorm_pre = nn.LayerNorm(hidden)
        self.layernorm_post = nn.LayerNorm(hidden)
        self.model = Llama4VisionEncoder(config)
        self.vision_adapter = Llama4VisionPixelShuffleMLP(config)
        self.register_buffer("rotary", vision_rotary(config), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.linear.weight.dtype))
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        x = torch.cat([x, cls], dim=1) + self.positional_embedding_vlm
        x = self.layernorm_pre(x)
        for layer in self.model.layers:
            x = layer(x, self.rotary)
        x = self.layernorm_post(x)[:, :-1]
        return self.vision_adapter(x)
