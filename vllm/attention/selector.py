"""Which attention backend runs: chosen once per engine, read from its config.

`VllmConfig` resolves `--attention-backend` (or VLLM_ATTENTION_BACKEND, or the
platform's default) to a class name (`attention_config.backend_cls`). The model
loader builds the model inside `attention_backend_scope(that name)`, so `Attention`
layers pick it up when they are built, and the model runners build their metadata
for the same class: a step never mixes backends and no layer inspects tensors to
decide. Backends keep no per-layer state, so one instance per class is shared by
every layer and runner of the process.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any, Iterator, Optional

_scoped: list[str] = []
"""Backend class names of the enclosing `attention_backend_scope`s (innermost last)."""


@functools.lru_cache(maxsize=None)
def load_attn_backend(qualname: str) -> Any:
    """The shared instance of the backend class `qualname` ('pkg.module.Class')."""
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)()


def backend_cls_of(vllm_config: Any) -> str:
    """The backend class name of an engine config (the platform's default for
    configs built without an attention_config)."""
    name = getattr(getattr(vllm_config, "attention_config", None), "backend_cls", "")
    if name:
        return name
    from vllm.platforms import current_platform
    return current_platform.get_attn_backend_cls(None, vllm_config)


@contextlib.contextmanager
def attention_backend_scope(qualname: Optional[str]) -> Iterator[None]:
    """Layers built inside use backend `qualname` (None: leave the choice as is)."""
    if qualname:
        _scoped.append(qualname)
    try:
        yield
    finally:
        if qualname:
            _scoped.pop()


def get_attn_backend() -> Any:
    """The backend of the model being built: the scope's, else the platform's default."""
    if _scoped:
        return load_attn_backend(_scoped[-1])
    from vllm.platforms import current_platform
    return load_attn_backend(current_platform.get_attn_backend_cls())
