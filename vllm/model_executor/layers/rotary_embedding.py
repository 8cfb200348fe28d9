"""RoPE: `get_rope`, which builds the variant a model config asks for, and the classes
models use (their cos/sin cache and forwards live in rotary_base.py, the variants in
rotary_*.py; each variant imports the base, so this factory imports the variants only
when asked for one and nothing imports this module back).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from vllm.model_executor.layers.rotary_base import (LinearScalingRotaryEmbedding,
                                                    Llama3RotaryEmbedding, RotaryEmbedding)

__all__ = ["LinearScalingRotaryEmbedding", "Llama3RotaryEmbedding", "RotaryEmbedding",
           "SUPPORTED_ROPE_TYPES", "get_rope"]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn", "dynamic")


def _require(scaling: dict[str, Any], key: str, rope_type: str) -> Any:
    if key not in scaling:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs the field {key!r}.")
    return scaling[key]


def get_rope(head_size: int, rotary_dim: int, max_position: int, base: float,
             rope_scaling: Optional[dict[str, Any]] = None, is_neox_style: bool = True,
             dtype: Optional[torch.dtype] = None) -> RotaryEmbedding:
    """Build the rotary embedding a config asks for.

    `rope_scaling` is the HF dict (`rope_scaling` or, in transformers 5,
    `rope_parameters`); its `rope_type` (or legacy `type`) selects the variant.
    Every call returns a new module: a model builds one and shares it across its
    layers, so casting or moving one model never touches another's cache.
    """
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    args = (head_size, rotary_dim, max_position, base, is_neox_style)
    if rope_type == "default":
        return RotaryEmbedding(*args, dtype=dtype)
    if rope_type == "linear":
        return LinearScalingRotaryEmbedding(
            *args, scaling_factor=float(_require(scaling, "factor", rope_type)), dtype=dtype)
    if rope_type == "llama3":
        return Llama3RotaryEmbedding(
            *args, scaling_factor=float(_require(scaling, "factor", rope_type)),
            low_freq_factor=float(_require(scaling, "low_freq_factor", rope_type)),
            high_freq_factor=float(_require(scaling, "high_freq_factor", rope_type)),
            orig_max_position=int(_require(scaling, "original_max_position_embeddings",
                                           rope_type)),
            dtype=dtype)
    if rope_type == "longrope":
        from vllm.model_executor.layers.rotary_longrope import Phi3LongRoPEScaledRotaryEmbedding
        return Phi3LongRoPEScaledRotaryEmbedding(
            head_size, rotary_dim, max_position,
            int(_require(scaling, "original_max_position_embeddings", rope_type)), base,
            is_neox_style, _require(scaling, "short_factor", rope_type),
            _require(scaling, "long_factor", rope_type), scaling.get("attention_factor"),
            scaling.get("factor"), dtype=dtype)
    if rope_type == "dynamic":
        from vllm.model_executor.layers.rotary_dynamic_ntk import (
            DynamicNTKScalingRotaryEmbedding)
        return DynamicNTKScalingRotaryEmbedding(
            *args, scaling_factor=float(_require(scaling, "factor", rope_type)), dtype=dtype)
    if rope_type == "yarn":
        from vllm.model_executor.layers.rotary_yarn import YaRNScalingRotaryEmbedding
        _require(scaling, "original_max_position_embeddings", rope_type)
        return YaRNScalingRotaryEmbedding(*args, scaling=scaling, dtype=dtype)
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported; supported: "
                     f"{', '.join(SUPPORTED_ROPE_TYPES)}.")
