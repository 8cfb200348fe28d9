"""The vision encoder on HPU: image batches padded to bucketed sizes, warmed.

On Gaudi every new input shape is a graph compile. Images reach the encoder in
batches of any size (the images of one step not in the encoder cache), so each
batch is padded to a bucket, and the warmup runs every bucket on the model's dummy
image, so serving images of any size compiles nothing; each call is tracked by the
runner's CompileTracker under its input signature. Two kinds of towers:

- fixed resolution (LLaVA's CLIP): every image has the same shapes and yields the
  same number of image tokens, so a bucket of images is a bucket of image-token
  counts. Batches are padded to 1, 2, 4, ... images (up to the per-prompt image
  limit's power of two; more images run as several full buckets) with copies of
  the first image, whose outputs are dropped.
- dynamic resolution (Qwen2.5-VL, a model with `mm_item_size`): an image is a
  variable number of patches, so the images of a call are concatenated and padded
  to a bucketed patch count (`patch_buckets`: doubling up to the patches of the
  largest image the checkpoint's image processor makes); the model runs the padded
  layout with masked attention (`embed_multimodal(items, pad_to=...)`). Images
  that do not fit the largest bucket together run in several calls.
"""
from __future__ import annotations

from typing import Any

import torch

MIN_PATCH_BUCKET = 64
"""Smallest patch-count bucket (a multiple of any merge block)."""


def image_buckets(max_images: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= max_images."""
    buckets = [1]
    while buckets[-1] < max(1, max_images):
        buckets.append(buckets[-1] * 2)
    return buckets


def patch_buckets(max_patches: int) -> list[int]:
    """MIN_PATCH_BUCKET, doubling, up to the first one >= max_patches."""
    buckets = [MIN_PATCH_BUCKET]
    while buckets[-1] < max_patches:
        buckets.append(buckets[-1] * 2)
    return buckets


class HPUVisionEncoder:

    def __init__(self, model: Any, tracker: Any, mode_name: str, model_config: Any) -> None:
        self.model = model
        self.tracker = tracker
        self.mode_name = mode_name
        self.by_patches = hasattr(model, "mm_item_size")
        if self.by_patches:
            self.buckets = patch_buckets(model.max_mm_item_size(model_config))
        else:
            from vllm.multimodal.processing import mm_limit
            self.buckets = image_buckets(mm_limit(model_config.limit_mm_per_prompt, "image"))

    def encode(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """The model's `embed_multimodal` on `items`, in bucket-sized calls."""
        if self.by_patches:
            return self._encode_by_patches(items)
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

    def _encode_by_patches(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Consecutive images grouped while their patches fit the largest bucket;
        each group padded to its bucket."""
        outputs: list[torch.Tensor] = []
        largest = self.buckets[-1]
        group: list[dict[str, torch.Tensor]] = []
        total = 0
        for item in items + [None]:
            size = self.model.mm_item_size(item) if item is not None else 0
            if group and (item is None or total + size > largest):
                outputs.extend(self._run_patch_bucket(group, total))
                group, total = [], 0
            if item is not None:
                if size > largest:
                    raise ValueError(f"An image of {size} patches exceeds the largest vision "
                                     f"bucket ({largest} patches).")
                group.append(item)
                total += size
        return outputs

    def _run_patch_bucket(self, group: list[dict[str, torch.Tensor]],
                          total: int) -> list[torch.Tensor]:
        bucket = next(b for b in self.buckets if b >= total)
        dtype = str(group[0]["pixel_values"].dtype)
        with self.tracker.track_pass(f"vision {bucket} patches",
                                     ("vision", self.mode_name, bucket, dtype)):
            return self.model.embed_multimodal(group, pad_to=bucket)

    def warmup(self) -> None:
        """Every bucket once, on the model's dummy image(s)."""
        for size in self.buckets:
            if self.by_patches:
                self.encode([self.model.dummy_mm_item(size)])
            else:
                self.encode([self.model.dummy_mm_item()] * size)
