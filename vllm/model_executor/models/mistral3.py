"""Mistral Small 3.x (Mistral3ForConditionalGeneration): Pixtral vision encoder, patch
merger and projector, and a Mistral language model.

An image of h x w patches becomes (h/m) x (w/m) tokens (m = spatial_merge_size): the
feature layer's states are RMS-normalized, each m x m block of neighbouring patches is
concatenated (channel-major, as `F.unfold` lays it out) and merged by a linear layer,
then projected (linear-act-linear) into the language model's space. In the prompt an
image is rows of `[IMG]` tokens each closed by `[IMG_BREAK]`, the last by `[IMG_END]`
(vllm/multimodal/pixtral_processor.py): the whole block is the image's placeholder run
here, and its encoder output carries the break / end tokens' own text embeddings at
their places, so the runner's contiguous-run merge applies unchanged.

Fixed-shape platforms run the encoder on a padded patch count (masked attention) and
the merger on a padded block count; only the final placement of each image's rows is
per image.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch import nn

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.clip import vision_activation
from vllm.model_executor.models.llava import build_language_model
from vllm.model_executor.models.pixtral_vision import (PixtralVisionEncoder,
                                                       build_pixtral_inputs, patchify)
from vllm.model_executor.models.vlm_base import LanguageModelDelegate, load_vlm_weights

_RENAMES = (("model.language_model.", "language_model.model."),
            ("model.vision_tower.", "vision_tower."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
            ("lm_head.", "language_model.lm_head."))
"""transformers 5's checkpoint prefixes -> this module's (the old naming needs none)."""


def merge_index(grids: list[tuple[int, int]], merge: int) -> torch.Tensor:
    """[blocks, merge^2] patch rows (in the concatenated patches) of each merged block,
    image by image, blocks row-major, the block's patches row-major. A last row or
    column of patches that makes no whole block is left out (as `F.unfold` does)."""
    out, base = [], 0
    for h, w in grids:
        bh, bw = h // merge, w // merge
        rows = torch.arange(h * w).view(h, w)[:bh * merge, :bw * merge]
        rows = rows.reshape(bh, merge, bw, merge)
        out.append(rows.permute(0, 2, 1, 3).reshape(-1, merge * merge) + base)
        base += h * w
    return torch.cat(out)


class Mistral3PatchMerger(nn.Module):

    def __init__(self, width: int, merge: int) -> None:
        super().__init__()
        self.merge = merge
        self.merging_layer = nn.Linear(width * merge * merge, width, bias=False)

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x [P, d], index [blocks, m^2] -> [blocks, d]; channel-major concatenation."""
        blocks = x[index]  # [blocks, m^2, d]
        return self.merging_layer(blocks.transpose(1, 2).reshape(index.shape[0], -1))


class Mistral3MultiModalProjector(nn.Module):

    def __init__(self, config: Any, num_feature_layers: int) -> None:
        super().__init__()
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        bias = bool(getattr(config, "multimodal_projector_bias", False))
        self.norm = RMSNorm(vision * num_feature_layers, eps=config.text_config.rms_norm_eps)
        self.patch_merger = Mistral3PatchMerger(vision * num_feature_layers,
                                                config.spatial_merge_size)
        self.linear_1 = nn.Linear(vision * num_feature_layers, text, bias=bias)
        self.act = vision_activation(config.projector_hidden_act)
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        merged = self.patch_merger(self.norm(features), index)
        return self.linear_2(self.act(self.linear_1(merged)))


class Mistral3ForConditionalGeneration(LanguageModelDelegate, nn.Module):
    """Pixtral tower + merger/projector + Mistral language model (module docstring)."""

    supports_multimodal = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.merge = int(config.spatial_merge_size)
        layer = config.vision_feature_layer
        layers = len(layer) if isinstance(layer, (list, tuple)) else 1
        self.vision_tower = PixtralVisionEncoder(config.vision_config, layer)
        self.multi_modal_projector = Mistral3MultiModalProjector(config, layers)
        self.language_model = build_language_model(vllm_config, "language_model")
        self.start_layer = self.language_model.start_layer
        self.end_layer = self.language_model.end_layer

    # ------------------------------------------------------ frontend helpers
    @staticmethod
    def load_hf_processor(path: str) -> Any:
        from vllm.multimodal.pixtral_processor import PixtralImageProcessor
        return PixtralImageProcessor.from_pretrained(path)

    @staticmethod
    def split_mm_data(hf_outputs: Any, num_items: int) -> list[dict[str, torch.Tensor]]:
        """Each image cropped to its size and cut into patches [h*w, C*p*p], its patch
        grid [1, 2] and the [break, end] token ids."""
        patch = int(hf_outputs["patch_size"])
        items = []
        for i in range(num_items):
            height, width = (int(v) for v in hf_outputs["image_sizes"][i])
            image = hf_outputs["pixel_values"][i, :, :height, :width]
            items.append({"pixel_values": patchify(image, patch).contiguous(),
                          "image_grid": torch.tensor([[height // patch, width // patch]]),
                          "image_break_ids": hf_outputs["image_break_ids"].clone()})
        return items

    @staticmethod
    def num_mm_tokens(hf_config: Any, item: dict[str, torch.Tensor]) -> int:
        """The image's whole block: rows x (cols + 1) tokens (breaks and the end)."""
        h, w = (int(v) for v in item["image_grid"].view(-1))
        merge = int(hf_config.spatial_merge_size)
        return (h // merge) * (w // merge + 1)

    @staticmethod
    def mm_placeholder_ranges(token_ids: list[int], hf_config: Any, lengths: list[int],
                              items: Any = None) -> list[tuple[int, int]]:
        """(offset, length) of each image's block: from its first `[IMG]` on, `length`
        tokens (the processor wrote them); ValueError when the prompt's blocks do not
        match the images."""
        image = Mistral3ForConditionalGeneration.image_token_id(hf_config)
        ranges, pos = [], 0
        for n in lengths:
            try:
                start = token_ids.index(image, pos)
            except ValueError:
                raise ValueError(f"The prompt has image placeholders for fewer than its "
                                 f"{len(lengths)} images.") from None
            if start + n > len(token_ids):
                raise ValueError("An image's placeholder block is cut short in the prompt.")
            ranges.append((start, n))
            pos = start + n
        if image in token_ids[pos:]:
            raise ValueError("The prompt has more image placeholders than images.")
        return ranges

    # --------------------------------------------------------------- runner
    def mm_item_size(self, item: dict[str, torch.Tensor]) -> int:
        """Encoder work of one image: its patches (what the HPU encoder buckets)."""
        return int(item["pixel_values"].shape[0])

    @staticmethod
    def max_mm_item_size(model_config: Any) -> int:
        """Patches of the largest image the checkpoint's image processor makes (its
        longest edge, square)."""
        from transformers import AutoImageProcessor
        proc = AutoImageProcessor.from_pretrained(model_config.tokenizer_path
                                                  or model_config.model_path)
        patch = proc.patch_size
        patch = int(patch["height"] if isinstance(patch, dict) else patch)
        return (int(proc.size["longest_edge"]) // patch) ** 2

    def dummy_mm_item(self, num_patches: int) -> dict[str, torch.Tensor]:
        """A blank image of `num_patches` patches (a multiple of merge^2), one merge
        block high (warmup of a patch-count bucket)."""
        m, vc = self.merge, self.config.vision_config
        if num_patches % (m * m):
            raise ValueError(f"num_patches {num_patches} is not a multiple of {m * m}.")
        dim = vc.num_channels * vc.patch_size ** 2
        return {"pixel_values": torch.zeros(num_patches, dim, dtype=torch.float32),
                "image_grid": torch.tensor([[m, num_patches // m]]),
                "image_break_ids": torch.tensor([0, 0])}

    def embed_multimodal(self, items: list[dict[str, torch.Tensor]],
                         pad_to: Optional[int] = None) -> list[torch.Tensor]:
        """One [rows * (cols + 1), hidden] tensor per image (image features with the
        break / end embeddings between rows), all images in one encoder call;
        `pad_to` patches: the fixed-shape (masked, padded) layout of that size."""
        device = self.multi_modal_projector.linear_1.weight.device
        grids = [tuple(int(v) for v in it["image_grid"].view(-1)) for it in items]
        inputs = build_pixtral_inputs([it["pixel_values"] for it in items], grids, pad_to,
                                      device)
        index = merge_index(grids, self.merge)
        if pad_to is not None:  # a fixed block count: padding blocks read patch 0
            blocks = pad_to // (self.merge * self.merge)
            index = torch.cat([index, index.new_zeros(blocks - index.shape[0],
                                                      index.shape[1])])
        feats = self.multi_modal_projector(self.vision_tower(inputs), index.to(device))
        return self._place_rows(items, grids, feats)

    def _place_rows(self, items: list[dict[str, torch.Tensor]], grids: list[tuple[int, int]],
                    feats: torch.Tensor) -> list[torch.Tensor]:
        outputs, start = [], 0
        for item, (h, w) in zip(items, grids):
            rows, cols = h // self.merge, w // self.merge
            image = feats[start:start + rows * cols].view(rows, cols, -1)
            start += rows * cols
            seps = self.get_input_embeddings(item["image_break_ids"].to(feats.device))
            sep = seps[[0] * (rows - 1) + [1]].to(image.dtype)  # breaks, then the end
            outputs.append(torch.cat([image, sep[:, None]], dim=1).reshape(-1, image.shape[-1]))
        return outputs

    # -------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """`language_model.*` to the language model's loader, the tower's and
        projector's by name (tower blocks it does not build are skipped)."""
        return load_vlm_weights(
            self, weights, _RENAMES,
            skip=lambda name: name.startswith("vision_tower.") and
            not self.vision_tower.owns_weight(name[len("vision_tower."):]))