"""The scheduler's side of the encoder cache: which image encoder outputs the runner
holds, and how much encoder work one step may do.

The runner keeps each image's encoder output, keyed by the image's content hash,
from the step that first needs it until this manager evicts it
(ModelRunnerBase.gather_mm_embeddings / free_encoder_outputs). Tracking the same set
here lets the scheduler (1) charge a step only for images not encoded yet, within
`encoder_budget` placeholder tokens per step, (2) bound the runner's memory by
`capacity` tokens, and (3) share one output between requests with the same image.
An output is freeable once no unfinished request uses it; freeable outputs stay
cached (a later request may reuse them) until space is needed.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any


class EncoderCacheManager:

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        """Placeholder tokens' worth of encoder outputs the runner may hold."""
        self.used = 0
        self.sizes: dict[str, int] = {}
        self.users: dict[str, set[str]] = {}
        self.freeable: OrderedDict[str, int] = OrderedDict()
        """Cached outputs no request uses, oldest first (evicted in that order)."""
        self._freed: list[str] = []

    def is_cached(self, identifier: str) -> bool:
        return identifier in self.sizes

    def use(self, req_id: str, identifier: str) -> None:
        """Mark a cached output as used by `req_id` (no longer freeable)."""
        self.users.setdefault(identifier, set()).add(req_id)
        self.freeable.pop(identifier, None)

    def can_allocate(self, size: int) -> bool:
        """Whether an output of `size` tokens fits, evicting freeable ones if needed."""
        return size <= self.capacity - self.used + sum(self.freeable.values())

    def allocate(self, req_id: str, identifier: str, size: int) -> None:
        """Reserve room for an output the runner computes this step."""
        while self.capacity - self.used < size and self.freeable:
            old, old_size = self.freeable.popitem(last=False)
            del self.sizes[old]
            self.users.pop(old, None)
            self.used -= old_size
            self._freed.append(old)
        self.sizes[identifier] = size
        self.used += size
        self.use(req_id, identifier)

    def release(self, req_id: str, features: Any) -> None:
        """`req_id` finished (or was preempted): its outputs become freeable when no
        other request uses them."""
        for feature in features or ():
            users = self.users.get(feature.identifier)
            if users is None:
                continue
            users.discard(req_id)
            if not users and feature.identifier in self.sizes:
                self.freeable[feature.identifier] = self.sizes[feature.identifier]

    def take_freed(self) -> list[str]:
        """Outputs evicted since the last call: the runner drops them this step."""
        freed, self._freed = self._freed, []
        return freed


def schedule_encoder_inputs(manager: EncoderCacheManager, req_id: str, features: Any,
                            start: int, num_new: int, budget: int,
                            whole_images: bool = False) -> tuple[int, list[Any], int]:
    """(tokens to schedule, images to encode this step, encoder budget left) for a
    request computing positions start .. start + num_new - 1.

    Images already cached cost nothing. An image that does not fit the step's encoder
    budget or the cache cuts the chunk just before its first placeholder token (it
    is encoded in a later step); 0 tokens when that is the chunk's first position.
    `whole_images` (--disable-chunked-mm-input): the chunk also stops before an image
    whose placeholders it would not reach the end of.
    """
    if whole_images:
        num_new = _before_cut_image(features, start, num_new)
    to_encode: list[Any] = []
    pending = 0
    for feature in features or ():
        if not feature.overlaps(start, start + num_new):
            continue
        if manager.is_cached(feature.identifier) or any(
                f.identifier == feature.identifier for f in to_encode):
            continue
        if feature.length > budget - pending or not manager.can_allocate(
                pending + feature.length):
            num_new = max(0, feature.offset - start) if feature.offset >= start else 0
            break
        to_encode.append(feature)
        pending += feature.length
    if num_new == 0:
        return 0, [], budget
    return num_new, to_encode, budget - pending


def _before_cut_image(features: Any, start: int, num_new: int) -> int:
    """num_new cut so that no image's placeholders are split at the chunk's end."""
    end = start + num_new
    for feature in features or ():
        if feature.overlaps(start, end) and feature.end > end:
            return max(0, feature.offset - start)
    return num_new
