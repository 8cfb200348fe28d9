"""Gemma 3's image processing: the checkpoint's image processor and tokenizer with the
Gemma 3 processor's placeholder rule.

transformers' Gemma3Processor reaches for the torchvision image processor; serving
needs only the image processor (resize every image to the tower's square resolution,
normalize; pan-and-scan crops are not supported here) and this rule: each
`<start_of_image>` of the prompt becomes a blank line, `<start_of_image>`, the
image's `mm_tokens_per_image` `<image_soft_token>` tokens, `<end_of_image>` and a blank
line. The soft tokens take the image features and attend to each other both ways.
"""
from __future__ import annotations

from typing import Any

BOI, IMAGE, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"


class Gemma3ImageProcessor:

    def __init__(self, image_processor: Any, tokenizer: Any, tokens_per_image: int) -> None:
        if getattr(image_processor, "do_pan_and_scan", False):
            raise ValueError("Gemma 3's pan-and-scan crops are not supported; set "
                             "do_pan_and_scan false in the image processor config.")
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = BOI
        self.tokens_per_image = tokens_per_image

    @classmethod
    def from_pretrained(cls, path: str) -> "Gemma3ImageProcessor":
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer
        config = AutoConfig.from_pretrained(path)
        return cls(AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path),
                   int(config.mm_tokens_per_image))

    def expand(self, text: str, num_images: int) -> str:
        parts = text.split(BOI)
        if len(parts) - 1 != num_images:
            raise ValueError(f"The prompt has {len(parts) - 1} {BOI} image placeholders "
                             f"for {num_images} images.")
        block = f"\n\n{BOI}{IMAGE * self.tokens_per_image}{EOI}\n\n"
        return block.join(parts)

    def __call__(self, text: list[str], images: list[Any], return_tensors: str = "pt") -> Any:
        """input_ids [1, L] (placeholders expanded), attention_mask, pixel_values
        [images, C, S, S]."""
        if len(text) != 1:
            raise ValueError("Gemma3ImageProcessor takes one prompt.")
        pixels = self.image_processor(images=images, return_tensors=return_tensors)
        out = dict(self.tokenizer([self.expand(text[0], len(images))],
                                  return_tensors=return_tensors))
        out["pixel_values"] = pixels["pixel_values"]
        return out
