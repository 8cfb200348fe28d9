"""A runner's KV cache from the layers' specs (vllm/kv_cache_spec.py): which specs this
rank's layers have, and one cache object per shared tensor, handed to each layer.

Every platform allocates the same way and differs only in what one layer's cache is
(the CPU/CUDA head-major `[parts, heads, slots, head_size]` tensor, the HPU's separate
K and V): `allocate_layer_caches` takes that as a function of the spec.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from vllm.kv_cache_spec import (AttentionSpec, FullAttentionSpec, KVCacheConfig,
                                KVCacheSpec, MambaSpec, MLAAttentionSpec,
                                SlidingWindowSpec)


def collect_kv_cache_specs(model: torch.nn.Module, block_size: int,
                           dtype: torch.dtype) -> dict[int, KVCacheSpec]:
    """The spec of each attention layer of `model` that keeps a KV cache, and of each
    state-space layer (its `state_spec`: vllm/kv_cache_spec.py `MambaSpec`), by global
    layer index (`dtype`: the KV cache's, which may differ from the model's)."""
    from vllm.attention.layer import ENCODER_ONLY, Attention
    from vllm.attention.mla import MLAAttention
    specs: dict[int, KVCacheSpec] = {}
    for module in model.modules():
        if isinstance(module, MLAAttention):
            specs[module.layer_idx] = MLAAttentionSpec(block_size, 1, module.head_size, dtype)
        elif isinstance(module, Attention) and module.attn_type != ENCODER_ONLY:
            specs[module.layer_idx] = _attention_spec(module, block_size, dtype)
        elif callable(getattr(module, "state_spec", None)):  # a state-space layer
            specs[getattr(module, "state_key", module.layer_idx)] = module.state_spec(block_size)
    return specs


def _attention_spec(layer: Any, block_size: int, dtype: torch.dtype) -> AttentionSpec:
    if layer.sliding_window is not None:
        return SlidingWindowSpec(block_size, layer.num_kv_heads, layer.head_size, dtype,
                                 sliding_window=int(layer.sliding_window))
    return FullAttentionSpec(block_size, layer.num_kv_heads, layer.head_size, dtype)


def runner_kv_cache_specs(model: Any, model_config: Any, block_size: int, dtype: torch.dtype,
                          kv_heads_per_rank: int, owned: Iterable[int]
                          ) -> dict[int, KVCacheSpec]:
    """The specs of the `owned` layers, from the model's attention layers. A model
    without any (a stand-in in tests, a model not loaded yet) gets the model config's
    uniform spec for each owned layer."""
    owned = list(owned)
    specs = collect_kv_cache_specs(model, block_size, dtype) if model is not None else {}
    # (a state layer beside an attention layer is keyed past the layer count: kept)
    specs = {i: s for i, s in specs.items()
             if i in set(owned) or (isinstance(s, MambaSpec) and i >= len(owned))}
    if specs:
        return specs
    head_size = model_config.get_head_size()
    if getattr(model_config, "use_mla", False):
        return {i: MLAAttentionSpec(block_size, 1, head_size, dtype) for i in owned}
    return {i: FullAttentionSpec(block_size, kv_heads_per_rank, head_size, dtype)
            for i in owned}


def allocate_layer_caches(config: KVCacheConfig, owned: Iterable[int], num_layers: int,
                          make: Callable[[KVCacheSpec, int], list[Any]],
                          missing: Any) -> list[Any]:
    """The per-layer cache list (by global layer index): one cache object per tensor of
    `config` that serves an owned layer, the same object for every layer it serves;
    `missing` for the layers this rank does not hold. `make(spec, count)` builds
    `count` zeroed caches of `spec`'s shape (one call per distinct shape, so the CPU
    commits each shape's memory in one mapping)."""
    owned = set(owned)
    by_spec: dict[KVCacheSpec, list[list[int]]] = {}
    for tensor in config.kv_cache_tensors:
        layers = [i for i in tensor.shared_by if i in owned]
        if layers:
            spec = config.layer_specs[layers[0]]
            by_spec.setdefault(_shape_spec(spec), []).append(layers)
    caches: list[Any] = [missing] * num_layers
    for spec, tensors in by_spec.items():
        for layers, cache in zip(tensors, make(spec, len(tensors))):
            for i in layers:
                caches[i] = cache
    return caches


def _shape_spec(spec: KVCacheSpec) -> KVCacheSpec:
    """Specs that allocate the same tensor (a window does not change the shape)."""
    return spec.as_full() if isinstance(spec, SlidingWindowSpec) else spec


def unique_tensors(caches: Iterable[Any]) -> list[torch.Tensor]:
    """Each tensor once (layers of different groups share tensors)."""
    seen: dict[int, torch.Tensor] = {}
    for t in caches:
        if isinstance(t, torch.Tensor) and t.numel():
            seen.setdefault(id(t), t)
    return list(seen.values())
