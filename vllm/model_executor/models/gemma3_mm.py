"""Gemma 3 4B-27B (Gemma3ForConditionalGeneration): SigLIP tower, pooled projector,
the Gemma 3 language model (5:1 sliding / global layers, vllm/model_executor/models/
gemma3.py).

An image (the tower's square resolution) becomes `mm_tokens_per_image` tokens: its
patch states average-pooled to a tokens_per_side^2 grid, Gemma-RMS-normalized and
projected by `mm_input_projection_weight`. They fill the image's `<image_soft_token>`
run (vllm/multimodal/gemma3_processor.py), and — unlike text — the tokens of one image
attend to each other both ways, in every layer (a sliding layer also keeps its window):
`bidirectional_mm` tells the runner to lay out those spans for attention and the
scheduler never to cut an image between two steps.

Gemma scales its text embeddings by sqrt(hidden) and not the image features; the
language model scales whatever it is given, so the image rows leave
`embed_multimodal` divided by that factor (the runner merges them into the unscaled
text embeddings, and the model's scale restores them).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.layers.gemma_layers import GemmaRMSNorm
from vllm.model_executor.models.llava import build_language_model
from vllm.model_executor.models.siglip import SiglipVisionTransformer
from vllm.model_executor.models.vlm_base import LanguageModelDelegate, load_vlm_weights

_RENAMES = (("model.language_model.", "language_model.model."),
            ("model.vision_tower.", "vision_tower."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
            ("lm_head.", "language_model.lm_head."))
"""transformers 5's in-memory prefixes -> this module's (the saved naming needs none)."""


class Gemma3MultiModalProjector(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        vc = config.vision_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vc.hidden_size, config.text_config.hidden_size), requires_grad=False)
        self.mm_soft_emb_norm = GemmaRMSNorm(vc.hidden_size, eps=vc.layer_norm_eps)
        self.patches_per_side = vc.image_size // vc.patch_size
        tokens_per_side = int(round(config.mm_tokens_per_image ** 0.5))
        if tokens_per_side ** 2 != config.mm_tokens_per_image or \
                self.patches_per_side % tokens_per_side:
            raise ValueError(f"mm_tokens_per_image {config.mm_tokens_per_image} is not a "
                             f"square grid dividing {self.patches_per_side} patches a side.")
        self.kernel = self.patches_per_side // tokens_per_side

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[N, patches, vision hidden] -> [N, tokens, text hidden]."""
        n, _, d = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(n, d, side, side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        normed = self.mm_soft_emb_norm(pooled)
        return torch.matmul(normed, self.mm_input_projection_weight).type_as(patches)


class Gemma3ForConditionalGeneration(LanguageModelDelegate, nn.Module):
    """SigLIP tower + projector + Gemma 3 language model (see the module docstring)."""

    supports_multimodal = True
    bidirectional_mm = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.vision_tower = SiglipVisionTransformer(config.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(config)
        self.language_model = build_language_model(vllm_config, "language_model")
        self.start_layer = self.language_model.start_layer
        self.end_layer = self.language_model.end_layer

    # ------------------------------------------------------ frontend helpers
    @staticmethod
    def load_hf_processor(path: str) -> Any:
        from vllm.multimodal.gemma3_processor import Gemma3ImageProcessor
        return Gemma3ImageProcessor.from_pretrained(path)

    @staticmethod
    def split_mm_data(hf_outputs: Any, num_items: int) -> list[dict[str, torch.Tensor]]:
        pixels = hf_outputs["pixel_values"]
        return [{"pixel_values": pixels[i:i + 1].contiguous()} for i in range(num_items)]

    @staticmethod
    def num_mm_tokens(hf_config: Any, item: dict[str, torch.Tensor]) -> int:
        return int(hf_config.mm_tokens_per_image)

    # --------------------------------------------------------------- runner
    def dummy_mm_item(self) -> dict[str, torch.Tensor]:
        """One blank image at the tower's resolution (warmup: every image has it)."""
        vc = self.config.vision_config
        return {"pixel_values": torch.zeros(1, vc.num_channels, vc.image_size, vc.image_size)}

    def embed_multimodal(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """One [mm_tokens_per_image, hidden] tensor per image (pre-divided by the
        language model's embedding scale; see the module docstring)."""
        weight = self.multi_modal_projector.mm_input_projection_weight
        pixels = torch.cat([it["pixel_values"] for it in items]).to(weight.device)
        feats = self.multi_modal_projector(self.vision_tower(pixels))
        scale = float(getattr(self.language_model.model, "embedding_multiplier", 1.0))
        return list((feats / scale).unbind(0))

    # -------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """`language_model.*` to the language model's loader, the tower's and the
        projector's by name (the hub's SigLIP names sit under `vision_model.`;
        transformers 5 saves none)."""
        return load_vlm_weights(
            self, weights, _RENAMES,
            rename=lambda name: name.replace("vision_tower.vision_model.", "vision_tower.", 1))