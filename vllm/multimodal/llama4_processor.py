"""Llama 4's image processing: tiles, a global thumbnail, and the placeholder block.

transformers' Llama 4 image processor needs torchvision; this is the same procedure on
PIL images:
- the canvas: among the resolutions made of up to `max_patches` square tiles of
  `size` pixels (every factorization h x w of 1..max_patches tiles), the one needing
  the least upscaling (or, when every canvas is smaller, the least downscaling), the
  smaller area on a tie;
- the image resized without distortion to fit it (never upscaled past one tile side),
  padded with black at the right and bottom, normalized (mean = std = 0.5, rounded to
  bfloat16 as the reference implementation does), cut into its h x w tiles row by row;
- with more than one tile, the whole image squeezed to one tile comes last.

Each `<|image|>` of the prompt becomes `<|image_start|>`, per tile row the tiles'
`<|patch|>` runs separated by `<|tile_x_separator|>` and closed by
`<|tile_y_separator|>` (only with more than one tile), then `<|image|>`, the global
tile's patch run, and `<|image_end|>`. Each tile has `(size / patch)^2 * ratio^2` patch
tokens (the vision adapter's pixel shuffle).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

START, END, IMAGE = "<|image_start|>", "<|image_end|>", "<|image|>"
PATCH, TILE_X, TILE_Y = "<|patch|>", "<|tile_x_separator|>", "<|tile_y_separator|>"
SPECIAL = (START, END, IMAGE, PATCH, TILE_X, TILE_Y)


def canvas_options(max_tiles: int, tile: int) -> list[tuple[int, int]]:
    """(height, width) in pixels of every arrangement of 1..max_tiles tiles."""
    out = []
    for count in range(max_tiles, 0, -1):
        for rows in range(1, count + 1):
            if count % rows == 0:
                out.append((rows * tile, count // rows * tile))
    return out


def best_canvas(height: int, width: int, options: list[tuple[int, int]]) -> tuple[int, int]:
    """The canvas an image of height x width is fitted into (module docstring)."""
    scales = [min(h / height, w / width) for h, w in options]
    up = [s for s in scales if s >= 1]
    chosen = min(up) if up else max(scales)
    fits = [o for o, s in zip(options, scales) if s == chosen]
    return min(fits, key=lambda o: o[0] * o[1])


def fit_without_distortion(height: int, width: int, target_h: int,
                           target_w: int) -> tuple[int, int]:
    """The largest (height, width) of the image's aspect ratio inside the target."""
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return max(min(int(height * scale_w), target_h), 1), target_w
    return target_h, max(min(int(width * scale_h), target_w), 1)


def _normalize(image: Any) -> torch.Tensor:
    """PIL RGB -> [3, H, W] float32 of bfloat16-rounded (x / 255 - 0.5) / 0.5."""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
    x = pixels.to(torch.bfloat16) * (1 / 255)
    return ((x - 0.5) / 0.5).float()


class Llama4ImageProcessor:

    def __init__(self, tokenizer: Any, tile: int, patch: int, shuffle_ratio: float,
                 max_tiles: int) -> None:
        self.tokenizer = tokenizer
        self.image_token = IMAGE
        self.tile, self.max_tiles = tile, max_tiles
        self.patches_per_tile = int((tile // patch) ** 2 * shuffle_ratio ** 2)
        ids = tokenizer.convert_tokens_to_ids(list(SPECIAL))
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError(f"The tokenizer lacks Llama 4's image tokens {SPECIAL}.")
        self.special_ids = torch.tensor(ids)

    @classmethod
    def from_pretrained(cls, path: str) -> "Llama4ImageProcessor":
        import json
        import os
        from transformers import AutoConfig, AutoTokenizer
        config = AutoConfig.from_pretrained(path)
        vc = config.vision_config
        proc = {}
        file = os.path.join(path, "preprocessor_config.json")
        if os.path.exists(file):
            with open(file) as f:
                proc = json.load(f)
        tile = int((proc.get("size") or {}).get("height", vc.image_size))
        return cls(AutoTokenizer.from_pretrained(path), tile, vc.patch_size,
                   vc.pixel_shuffle_ratio, int(proc.get("max_patches", 16)))

    def tiles(self, image: Any) -> tuple[torch.Tensor, tuple[int, int]]:
        """([tiles (+ the global one), 3, S, S] pixels, (rows, cols)) of one image."""
        from PIL import Image
        s = self.tile
        height, width = image.height, image.width
        canvas_h, canvas_w = best_canvas(height, width, canvas_options(self.max_tiles, s))
        limit_h = min(max(height, s), canvas_h)
        limit_w = min(max(width, s), canvas_w)
        new_h, new_w = fit_without_distortion(height, width, limit_h, limit_w)
        resized = _normalize(image.resize((new_w, new_h), Image.BILINEAR))
        canvas = torch.full((3, canvas_h, canvas_w), -1.0)  # black, normalized
        canvas[:, :new_h, :new_w] = resized
        rows, cols = canvas_h // s, canvas_w // s
        tiles = canvas.view(3, rows, s, cols, s).permute(1, 3, 0, 2, 4).reshape(-1, 3, s, s)
        if rows * cols > 1:
            whole = _normalize(image.resize((s, s), Image.BILINEAR))
            tiles = torch.cat([tiles, whole[None]])
        return tiles, (rows, cols)

    def block(self, rows: int, cols: int) -> str:
        """The placeholder text of one image of rows x cols tiles."""
        run = PATCH * self.patches_per_tile
        text = START
        if rows * cols > 1:
            for _ in range(rows):
                text += TILE_X.join([run] * cols) + TILE_Y
        return text + IMAGE + run + END

    def __call__(self, text: list[str], images: list[Any], return_tensors: str = "pt") -> Any:
        """input_ids [1, L] (placeholders expanded), attention_mask, pixel_values [all
        tiles, 3, S, S], aspect_ratios [images, 2] and the image tokens' ids."""
        if len(text) != 1:
            raise ValueError("Llama4ImageProcessor takes one prompt.")
        parts = text[0].split(IMAGE)
        if len(parts) - 1 != len(images):
            raise ValueError(f"The prompt has {len(parts) - 1} {IMAGE} image placeholders for "
                             f"{len(images)} images.")
        pixels, ratios, out = [], [], [parts[0]]
        for image, part in zip(images, parts[1:]):
            tiles, (rows, cols) = self.tiles(image)
            pixels.append(tiles)
            ratios.append((rows, cols))
            out += [self.block(rows, cols), part]
        encoded = dict(self.tokenizer(["".join(out)], return_tensors=return_tensors))
        encoded.update(pixel_values=torch.cat(pixels), aspect_ratios=torch.tensor(ratios),
                       image_special_ids=self.special_ids)
        return encoded
