"""SigLIP vision tower (Gemma 3's): CLIP's encoder layers without the class token or
the pre-norm, a bias on the patch convolution, and the post-norm applied to the output.

Fixed resolution: every image is `image_size` square, `(image_size / patch)^2` patches,
each with its learned position embedding; every patch attends to every patch of its
image. Weight names follow HF's SiglipVisionTransformer (the hub's `vision_model.*`
inside a SiglipVisionModel).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.models.clip import CLIPEncoder


class SiglipVisionEmbeddings(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size,
                                         kernel_size=config.patch_size,
                                         stride=config.patch_size)
        num_patches = (config.image_size // config.patch_size) ** 2
        self.position_embedding = nn.Embedding(num_patches, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, patches, hidden]."""
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype)).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight[:patches.shape[1]]


class SiglipVisionTransformer(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        if getattr(config, "vision_use_head", False):
            raise ValueError("SigLIP's pooling head is not supported (a vision-language "
                             "model uses the patch states).")
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = CLIPEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, patches, hidden], the post-normed last layer."""
        x = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
