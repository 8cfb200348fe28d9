"""The vision encoder on HPU: image batches padded to bucketed sizes, warmed.

On Gaudi every new input shape is a graph compile. Images reach the encoder in
batches of any size (the images of one step not in the encoder cache), so the batch
is padded to the next bucket (1, 2, 4, ... up to the per-prompt image limit's power of
two; more images run as several full buckets) with copies of its first image, whose
outputs are dropped. Each image of a fixed-resolution tower (LLaVA's CLIP) yields
the same number of image tokens, so a bucket of images is a bucket of image-token
counts. The warmup runs every bucket on the model's dummy image, so serving images
of any size (the processor resizes them) compiles nothing; each call is tracked by
the runner's CompileTracker under its input signature.
"""
from __future__ import annotations

from typing import Any

import torch


def image_buckets(max_images: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= max_images."""
    buckets = [1]
    while buckets[-1] < max(1, max_images):
        buckets.append(buckets[-1] * 2)
    return buckets


class HPUVisionEncoder:

    def __init__(self, model: Any, tracker: Any, mode_name: str, max_images: int) -> None:
        self.model = model
        self.tracker = tracker
        self.mode_name = mode_name
        self.buckets = image_buckets(max_images)

    def encode(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """The model's `embed_multimodal` on `items`, in bucket-sized batches."""
        outputs: list[torch.Tensor] = []
        largest = self.buckets[-1]
        for start in range(0, len(items), largest):
            chunk = items[start:start + largest]
            size = next(b for b in self.buckets if b >= len(chunk))
            padded = chunk + [chunk[0]] * (size - len(chunk))
            signature = ("vision", self.mode_name, size, tuple(
                (k, tuple(v.shape), str(v.dtype)) for k, v in sorted(padded[0].items())))
            with self.tracker.track_pass(f"vision {size} images", signature):
                outputs.extend(self.model.embed_multimodal(padded)[:len(chunk)])
        return outputs

    def warmup(self) -> None:
        """Every bucket once, on the model's dummy image."""
        dummy = self.model.dummy_mm_item()
        for size in self.buckets:
            self.encode([dummy] * size)
