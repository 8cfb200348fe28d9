"""The image half of transformers' Qwen2-VL / Qwen2.5-VL processor.

transformers' processor for these models always builds a video processor too,
which needs torchvision. Serving images needs only the checkpoint's image
processor (AutoImageProcessor: resizing to a multiple of patch * merge pixels
within its pixel limits, normalization, patchification) and tokenizer, plus the
processor's placeholder rule: each `<|image_pad|>` of the prompt becomes
(t * h * w) / merge^2 of them for the next image's (t, h, w) patch grid. This class
is that, with the processor's call signature, for installs without torchvision.
"""
from __future__ import annotations

from typing import Any

DEFAULT_IMAGE_TOKEN = "<|image_pad|>"


class QwenVLImageProcessor:

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = getattr(tokenizer, "image_token", None) or DEFAULT_IMAGE_TOKEN

    @classmethod
    def from_pretrained(cls, path: str) -> "QwenVLImageProcessor":
        from transformers import AutoImageProcessor, AutoTokenizer
        return cls(AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path))

    def expand(self, text: str, tokens_per_image: list[int]) -> str:
        """`text` with its i-th image token repeated tokens_per_image[i] times."""
        parts = text.split(self.image_token)
        if len(parts) - 1 != len(tokens_per_image):
            raise ValueError(f"The prompt has {len(parts) - 1} {self.image_token} image "
                             f"placeholders for {len(tokens_per_image)} images.")
        out = [parts[0]]
        for n, part in zip(tokens_per_image, parts[1:]):
            out += [self.image_token * n, part]
        return "".join(out)

    def __call__(self, text: list[str], images: list[Any], return_tensors: str = "pt") -> Any:
        """input_ids [1, L] (placeholders expanded), attention_mask, pixel_values
        [patches of all images, dim], image_grid_thw [images, 3]."""
        if len(text) != 1:
            raise ValueError("QwenVLImageProcessor takes one prompt.")
        pixels = self.image_processor(images=images, return_tensors=return_tensors)
        merge = self.image_processor.merge_size
        counts = (pixels["image_grid_thw"].prod(-1) // (merge * merge)).tolist()
        out = dict(self.tokenizer([self.expand(text[0], counts)], return_tensors=return_tensors))
        out.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
        return out
