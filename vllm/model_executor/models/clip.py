"""CLIP vision tower (ViT): the image encoder of LLaVA-1.5.

Patch embedding (a strided conv) plus a class token and learned positions, a
pre-norm, then pre-norm transformer layers with full (non-causal) attention over the
patches. Only the layers up to the one the multimodal model reads features from are
built: LLaVA reads the second-to-last layer, so the last one would be wasted work
(and its weights are skipped at load). Weight names follow HF's CLIPVisionModel.
The tower is small next to the language model and runs replicated on every rank.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def vision_activation(name: str):
    """HF `hidden_act` of a vision tower or projector -> function."""
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return F.gelu
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu
    raise ValueError(f"vision hidden_act {name!r} is not supported.")


class CLIPVisionEmbeddings(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.class_embedding = nn.Parameter(torch.empty(config.hidden_size))
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size,
                                         kernel_size=config.patch_size,
                                         stride=config.patch_size, bias=False)
        num_positions = (config.image_size // config.patch_size) ** 2 + 1
        self.position_embedding = nn.Embedding(num_positions, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, 1 + patches, hidden]."""
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        x = torch.cat([cls, patches], dim=1)
        return x + self.position_embedding.weight[:x.shape[1]]


class CLIPAttention(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        h = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(h, h) for _ in range(3))
        self.out_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        q, k, v = (p(x).view(n, t, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        return self.out_proj(out.transpose(1, 2).reshape(n, t, -1))


class CLIPMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = vision_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        eps = config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.self_attn = CLIPAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = CLIPMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):

    def __init__(self, config: Any, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """Hidden states of the requested layers (HF's `hidden_states` indexing: 0 is the
    embeddings after the pre-norm, i is the output of layer i)."""

    def __init__(self, config: Any, feature_layers: list[int]) -> None:
        super().__init__()
        total = config.num_hidden_layers
        self.feature_layers = [i if i >= 0 else total + 1 + i for i in feature_layers]
        if not all(0 <= i <= total for i in self.feature_layers):
            raise ValueError(f"vision_feature_layer {feature_layers} is outside the "
                             f"{total}-layer vision tower.")
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = CLIPEncoder(config, max(self.feature_layers))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, 1 + patches, hidden * len(feature_layers)]."""
        x = self.pre_layrnorm(self.embeddings(pixel_values))
        wanted = {0: x} if 0 in self.feature_layers else {}
        for i, layer in enumerate(self.encoder.layers, start=1):
            x = layer(x)
            if i in self.feature_layers:
                wanted[i] = x
        return torch.cat([wanted[i] for i in self.feature_layers], dim=-1)

    def owns_weight(self, name: str) -> bool:
        """Whether checkpoint tensor `name` (relative to the tower) has a parameter here:
        the post-norm and the layers past the last feature layer do not."""
        if name.startswith("post_layernorm."):
            return False
        if name.startswith("encoder.layers."):
            return int(name.split(".")[2]) < len(self.encoder.layers)
        return True
