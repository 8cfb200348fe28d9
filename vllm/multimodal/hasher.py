"""Content hashes of multimodal items.

Two images share a hash only when their decoded pixels (mode, size, bytes) are equal,
whatever file or URL they came from: the encoder cache and the prefix cache reuse
work across requests by this key, so it must never collide for different images.
"""
from __future__ import annotations

import hashlib
from typing import Any


def hash_image(image: Any, processor_kwargs: Any = None) -> str:
    """sha256 of a PIL image's mode, size and pixel bytes (and processor kwargs)."""
    h = hashlib.sha256()
    h.update(f"image|{image.mode}|{image.size[0]}x{image.size[1]}|".encode())
    h.update(image.tobytes())
    if processor_kwargs:
        h.update(repr(sorted(processor_kwargs.items())).encode())
    return h.hexdigest()
