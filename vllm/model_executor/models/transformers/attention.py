"""Our paged attention behind transformers' attention interface.

A `transformers` attention module computes q, k and v (with its own projections, norms
and rotary), then calls `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`. The
backend builds its models with `attn_implementation="vllm"`, registered here, so every
such call lands in `vllm_attention_forward`, which hands the tensors to our `Attention`
layer of that module's `layer_idx` (passed down by the backend's forward as the
`attention_instances` keyword). That layer reads the batch's metadata and its KV cache
from the forward context, exactly as a native model's layer does. Since the name is not
one of transformers' mask functions, the library builds no attention mask: causality,
sequence boundaries and windows are the paged attention's business.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vllm.attention import Attention

ATTN_IMPLEMENTATION = "vllm"
"""The name the backend's models are built with (vLLM's)."""


def vllm_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                           scaling: Optional[float] = None, dropout: float = 0.0,
                           attention_instances: Optional[dict[int, Attention]] = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' call: q [1, H, T, D], k/v [1, KVH, T, D] -> ([1, T, H, D], None).

    The batch is one row of all the step's tokens, flattened as our runners lay them out.
    The scale the module passes wins over the one read at build time (the first call,
    the profiling pass, settles it); a window that differs from the one the KV cache was
    sized for is an error, not a silent mismatch.
    """
    if attention_instances is None:
        raise RuntimeError(f"{type(module).__name__} was called without the backend's "
                           "attention layers: its model does not pass the forward's keyword "
                           "arguments down to attention, which the Transformers backend "
                           "needs.")
    attn = attention_instances[module.layer_idx]
    if query.shape[1] != attn.num_heads or key.shape[1] != attn.num_kv_heads:
        raise RuntimeError(f"layer {module.layer_idx}: the model computed {query.shape[1]} "
                           f"query and {key.shape[1]} KV heads; the backend sized "
                           f"{attn.num_heads} and {attn.num_kv_heads} from the config.")
    if scaling is not None and scaling != attn.scale:
        attn.scale = float(scaling)  # OPT scales q itself and passes 1.0
    window = kwargs.get("sliding_window") or None
    if window != attn.sliding_window:
        raise RuntimeError(f"layer {module.layer_idx} attends over a window of {window} "
                           f"tokens; the backend sized its KV cache for "
                           f"{attn.sliding_window}.")
    t = query.shape[2]
    q = query.transpose(1, 2).reshape(t, -1)
    k = key.transpose(1, 2).reshape(t, -1)
    v = value.transpose(1, 2).reshape(t, -1)
    out = attn(q, k, v)
    return out.view(1, t, -1, attn.head_size), None


def register_attention() -> None:
    """Register `vllm_attention_forward` under ATTN_IMPLEMENTATION (idempotent)."""
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_IMPLEMENTATION, vllm_attention_forward)


def _attention_modules(model: nn.Module) -> dict[int, nn.Module]:
    """layer index -> the model's attention module of that layer (the modules that call
    the interface: they carry `layer_idx` and `scaling`)."""
    found: dict[int, nn.Module] = {}
    for module in model.modules():
        idx = getattr(module, "layer_idx", None)
        if isinstance(idx, int) and hasattr(module, "scaling"):
            found.setdefault(idx, module)
    return found


def _sliding_window(config: Any, module: Optional[nn.Module], idx: int) -> Optional[int]:
    """The layer's window: the module's own attribute when it has one (the library sets
    it per layer), else the config's layer types."""
    if module is not None and hasattr(module, "is_sliding"):  # Exaone 4
        return (module.sliding_window or None) if module.is_sliding else None
    if module is not None and hasattr(module, "sliding_window"):
        return module.sliding_window or None
    layer_types = getattr(config, "layer_types", None)
    if layer_types and layer_types[idx] != "sliding_attention":
        return None
    return getattr(config, "sliding_window", None) or None


def build_attention_instances(model: nn.Module, config: Any, num_heads: int,
                              num_kv_heads: int, head_dim: int, prefix: str,
                              indices: Optional[range] = None) -> nn.ModuleDict:
    """One `Attention` per decoder layer of this pipeline stage (`indices`, default all),
    named `{prefix}.{i}` by its global index (the KV cache and the cache spec find
    layers by that index), with the layer's scale, window and soft-cap as the library's
    module states them."""
    modules = _attention_modules(model)
    layers = nn.ModuleDict()
    for idx in indices if indices is not None else range(config.num_hidden_layers):
        module = modules.get(idx)
        if getattr(module, "sinks", None) is not None:
            raise ValueError(f"{type(module).__name__} has attention sinks, which the "
                             "Transformers backend does not pass on; use the native model "
                             "(--model-impl vllm).")
        scale = getattr(module, "scaling", None) or head_dim ** -0.5
        soft_cap = (getattr(module, "attn_logit_softcapping", None)
                    or getattr(config, "attn_logit_softcapping", None))
        layers[str(idx)] = Attention(num_heads, head_dim, float(scale), num_kv_heads,
                                     prefix=f"{prefix}.{idx}.attn",
                                     logits_soft_cap=soft_cap,
                                     per_layer_sliding_window=_sliding_window(config, module,
                                                                              idx))
    return layers
