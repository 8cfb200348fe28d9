"""Which attention backend runs: chosen once from the current platform.

`Attention` layers call `get_attn_backend()` when they are built, and the model
runners build their metadata for the same object, so a step never mixes backends and
no layer inspects tensors to decide. Backends keep no per-layer state, so one
instance per class is shared by every layer and runner of the process.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.lru_cache(maxsize=None)
def load_attn_backend(qualname: str) -> Any:
    """The shared instance of the backend class `qualname` ('pkg.module.Class')."""
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)()


def get_attn_backend() -> Any:
    """The current platform's backend (`Platform.get_attn_backend_cls`)."""
    from vllm.platforms import current_platform
    return load_attn_backend(current_platform.get_attn_backend_cls())
