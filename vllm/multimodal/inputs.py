"""One multimodal item of a prompt, as it travels from the frontend to the core."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch


@dataclass
class MultiModalFeature:
    """An image of a prompt: its processed tensors and where its tokens sit.

    Plain tensors and ints only, so it pickles across to an engine core in another
    process with its Request.
    """
    modality: str
    """"image"."""
    identifier: str
    """Content hash of the item (hasher.py): the encoder-cache key and part of the
    prefix-cache keys of the blocks it covers."""
    offset: int
    """Prompt position of its first placeholder token."""
    length: int
    """Placeholder tokens it fills (= rows of its encoder output)."""
    data: dict[str, torch.Tensor] = field(default_factory=dict)
    """The processor's tensors for this item alone (LLaVA: pixel_values [1, 3, H, W];
    Qwen2.5-VL: pixel_values [patches, dim] and image_grid_thw [1, 3])."""

    @property
    def end(self) -> int:
        return self.offset + self.length

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any of its placeholder tokens lies in positions [start, end)."""
        return self.offset < end and start < self.end


def placeholder_ranges(token_ids: list[int], token_id: int,
                       lengths: list[int]) -> list[tuple[int, int]]:
    """(offset, length) of each item, given how many placeholder tokens each one has:
    items fill the placeholder tokens in order, each a contiguous stretch (adjacent
    items, e.g. "<image><image>", make one run that is cut by these lengths).
    ValueError when the placeholders do not add up."""
    positions = [i for i, t in enumerate(token_ids) if t == token_id]
    if len(positions) != sum(lengths):
        raise ValueError(f"The prompt has {len(positions)} image tokens after expansion, "
                         f"but its images need {sum(lengths)}: each image needs one "
                         "placeholder in the prompt.")
    ranges, k = [], 0
    for n in lengths:
        start = positions[k]
        if positions[k + n - 1] != start + n - 1:
            raise ValueError("An image's placeholder tokens are not contiguous in the "
                             "prompt.")
        ranges.append((start, n))
        k += n
    return ranges


def bidirectional_span_ids(features: Sequence[MultiModalFeature], start: int,
                           num_new: int) -> Optional[np.ndarray]:
    """For a model whose image tokens attend to each other both ways (Gemma 3): the
    image index of each position [0, start + num_new) of a request whose new tokens
    are [start, start + num_new), -1 for text; None when no image overlaps the new
    tokens (causal attention is then already right: later rows see whole images)."""
    end = start + num_new
    if not any(f.overlaps(start, end) for f in features):
        return None
    ids = np.full(end, -1, dtype=np.int64)
    for i, f in enumerate(features):
        if f.offset < end:
            ids[f.offset:min(f.end, end)] = i
    return ids
