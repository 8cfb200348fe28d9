"""Per-tensor KV cache scales from a checkpoint, for `--kv-cache-dtype fp8*`.

Checkpoints made for an fp8 KV cache carry one K and one V dequantization scale per
attention layer, under the names the tools that write them use (vLLM accepts the same):

- `model.layers.N.self_attn.k_scale` / `v_scale` (compressed-tensors with a
  `kv_cache_scheme`, AutoFP8 / `quant_method: fp8` checkpoints);
- `model.layers.N.self_attn.k_proj.output_scale` / `v_proj.output_scale` (older
  compressed-tensors);
- `model.layers.N.self_attn.attn.k_scale` / `v_scale` (vLLM's own module path);
- `model.layers.N.self_attn.kv_scale`: one scale for both.

`KVScales.filter` takes them out of the weight stream before the model's
`load_weights` sees it (no model needs to know them); `KVScales.apply` then sets
`Attention.k_scale` / `v_scale` of every attention layer. A scale that is not a
positive finite scalar, or scales for only some layers, fail the load naming the
tensor: nothing runs half-scaled. Without scales an fp8 cache uses 1.0 (with a
warning, as vLLM); with `--kv-cache-dtype auto` checkpoint scales are unused.
`q_scale` / `prob_scale` (fp8 attention arithmetic, which this engine does not do)
are dropped.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Iterable, Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

_SCALE_NAME = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?(?:(k|v|kv)_scale|(k|v)_proj\.output_scale)$")
_UNUSED_NAME = re.compile(r"(?:^|\.)layers\.\d+\.(?:.*\.)?(?:q|prob)_scale$")

KV_CACHE_SCHEME = {"type": ("float",), "num_bits": (8,), "strategy": ("tensor",),
                   "dynamic": (False,), "symmetric": (True, None)}
"""compressed-tensors `kv_cache_scheme` fields and the values this engine runs:
static per-tensor fp8 scales."""


def check_kv_cache_scheme(scheme: dict) -> None:
    """ValueError naming the field of a `kv_cache_scheme` other than static per-tensor
    fp8."""
    if not isinstance(scheme, dict):
        raise ValueError(f"quantization_config.kv_cache_scheme={scheme!r} must be an object.")
    for field, allowed in KV_CACHE_SCHEME.items():
        value = scheme.get(field)
        if value not in allowed:
            raise ValueError(
                f"quantization_config.kv_cache_scheme.{field}={value!r} is not supported; "
                f"supported: {', '.join(repr(a) for a in allowed if a is not None)} "
                "(static per-tensor fp8 KV cache scales).")


class KVScales:
    """Collects the KV cache scales of one checkpoint while its weights stream by."""

    def __init__(self) -> None:
        self.found: dict[tuple[int, str], tuple[str, float]] = {}
        """(layer index, 'k' | 'v') -> (checkpoint name, scale)."""

    def filter(self, weights: Iterable[tuple[str, torch.Tensor]]
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights` without the KV scale tensors, which are recorded."""
        for name, tensor in weights:
            m = _SCALE_NAME.search(name)
            if m:
                self._record(name, int(m.group(1)), m.group(2) or m.group(3), tensor)
            elif not _UNUSED_NAME.search(name):
                yield name, tensor

    def _record(self, name: str, layer: int, which: str, tensor: torch.Tensor) -> None:
        if tensor.numel() != 1:
            raise ValueError(f"KV cache scale {name} has shape {tuple(tensor.shape)}; only "
                             "per-tensor (one-element) scales are supported.")
        value = float(tensor.float().item())
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"KV cache scale {name}={value} must be positive and finite.")
        for part in ("k", "v") if which == "kv" else (which,):
            self.found[(layer, part)] = (name, value)

    def apply(self, model: nn.Module, cache_dtype: str, calculate: bool = False) -> None:
        """Set k_scale / v_scale on every attention layer of `model` (see the module
        docstring); `calculate` (--calculate-kv-scales): the first forward pass sets them
        instead."""
        from vllm.attention.layer import Attention
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        if calculate:
            for layer in layers:
                layer.calculate_kv_scales = True
            logger.info("KV cache scales of %d attention layers will be computed from the "
                        "first forward pass (calculate_kv_scales)%s.", len(layers),
                        "; the checkpoint's are not used" if self.found else "")
            return
        if cache_dtype == "auto":
            if self.found:
                logger.info("The checkpoint has KV cache scales; they are unused with "
                            "kv_cache_dtype=auto.")
            return
        have = [layer for layer in layers
                if (layer.layer_idx, "k") in self.found or (layer.layer_idx, "v") in self.found]
        if not have:
            logger.warning("Using KV cache scaling factor 1.0 for kv_cache_dtype=%s: the "
                           "checkpoint has no k_scale/v_scale. This may cost accuracy.",
                           cache_dtype)
            return
        for layer in layers:
            for part in ("k", "v"):
                entry = self.found.get((layer.layer_idx, part))
                if entry is None:
                    raise ValueError(
                        f"The checkpoint has KV cache scales for {len(have)} of {len(layers)} "
                        f"attention layers, but no {part}_scale for layer {layer.layer_idx} "
                        f"({layer.layer_name}).")
                setattr(layer, f"{part}_scale", entry[1])
        logger.info("KV cache scales from the checkpoint for %d attention layers "
                    "(kv_cache_dtype=%s).", len(layers), cache_dtype)
