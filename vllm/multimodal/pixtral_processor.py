"""Mistral 3's image processing: the checkpoint's Pixtral image processor and tokenizer
with the Pixtral processor's placeholder rule.

transformers' PixtralProcessor needs torchvision; serving needs only the image
processor (resize so the longest edge fits, to multiples of the patch size; normalize)
and this rule: each `[IMG]` of the prompt becomes, for an image of rows x cols merged
patches (patch * spatial_merge_size pixels each), `cols` `[IMG]` tokens then one
`[IMG_BREAK]` per row, the last row's break being `[IMG_END]`. Only the `[IMG]`
positions take image features; the break and end tokens keep their text embeddings.
The output adds what the model needs to place them: each image's size in pixels and
the break / end token ids.
"""
from __future__ import annotations

from typing import Any

import torch

IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN = "[IMG]", "[IMG_BREAK]", "[IMG_END]"


class PixtralImageProcessor:

    def __init__(self, image_processor: Any, tokenizer: Any, spatial_merge_size: int) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = IMAGE_TOKEN
        self.merge = spatial_merge_size
        patch = image_processor.patch_size
        self.patch_size = int(patch["height"] if isinstance(patch, dict) else patch)
        ids = tokenizer.convert_tokens_to_ids([IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN])
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError(f"The tokenizer lacks Pixtral's image tokens {IMAGE_TOKEN}, "
                             f"{BREAK_TOKEN}, {END_TOKEN}.")
        self.break_ids = torch.tensor(ids[1:])

    @classmethod
    def from_pretrained(cls, path: str) -> "PixtralImageProcessor":
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer
        config = AutoConfig.from_pretrained(path)
        return cls(AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path),
                   int(getattr(config, "spatial_merge_size", 1) or 1))

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of merged patches of a resized image."""
        unit = self.patch_size * self.merge
        return height // unit, width // unit

    def expand(self, text: str, grids: list[tuple[int, int]]) -> str:
        parts = text.split(IMAGE_TOKEN)
        if len(parts) - 1 != len(grids):
            raise ValueError(f"The prompt has {len(parts) - 1} {IMAGE_TOKEN} image "
                             f"placeholders for {len(grids)} images.")
        out = [parts[0]]
        for (rows, cols), part in zip(grids, parts[1:]):
            block = ((IMAGE_TOKEN * cols + BREAK_TOKEN) * rows)[:-len(BREAK_TOKEN)] + END_TOKEN
            out += [block, part]
        return "".join(out)

    def __call__(self, text: list[str], images: list[Any], return_tensors: str = "pt") -> Any:
        """input_ids [1, L] (placeholders expanded), attention_mask, pixel_values
        [images, C, H_max, W_max] (padded), image_sizes [images, 2] (pixels), and the
        per-call constants patch_size and image_break_ids ([break, end])."""
        if len(text) != 1:
            raise ValueError("PixtralImageProcessor takes one prompt.")
        pixels = self.image_processor(images=images, return_tensors=return_tensors)
        sizes = pixels["image_sizes"]
        grids = [self.grid(int(h), int(w)) for h, w in sizes.tolist()]
        out = dict(self.tokenizer([self.expand(text[0], grids)], return_tensors=return_tensors))
        out.update(pixel_values=pixels["pixel_values"], image_sizes=sizes,
                   patch_size=torch.tensor(self.patch_size), image_break_ids=self.break_ids)
        return out
