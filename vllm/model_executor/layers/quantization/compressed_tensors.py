"""`quant_method: compressed-tensors`: checkpoints written by the compressed-tensors
library (llm-compressor's output format).

Supported schemes (one `config_groups` entry per scheme, matched to layers by
`targets`; `ignore` keeps layers in float):
- `float-quantized` FP8: 8-bit float weights with a `tensor` or `channel` scale;
  activations static per-tensor (`input_scale`), dynamic per-token, or none
  (weight-only).
- `pack-quantized` W4A16 / W8A16: int weights packed 8 (or 4) per int32 along the
  input, `group` (any group size dividing the input) or `channel` scales, symmetric
  or with `weight_zero_point`, optional `weight_g_idx` (activation ordering).
A `kv_cache_scheme` must be static per-tensor fp8 (its scales are read by
kv_cache.py and used with `--kv-cache-dtype fp8`). Anything else (sparsity,
transforms, other formats, dynamic per-tensor activations) fails at start with the
field that asks for it.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig,
                                                                 all_or_none, check_field,
                                                                 checkpoint_names)
from vllm.model_executor.layers.quantization.fp8 import Fp8CheckpointLinearMethod
from vllm.model_executor.layers.quantization.kv_cache import check_kv_cache_scheme

_METHOD = "compressed-tensors"


def _matches(name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif pattern == name or pattern == "Linear":
            return True
    return False


class _Scheme:
    """One config group, validated."""

    def __init__(self, group_name: str, group: dict[str, Any], default_format: str) -> None:
        where = f"config_groups.{group_name}"
        self.targets = list(group.get("targets") or [])
        if not self.targets:
            raise ValueError(f"quantization_config.{where}.targets is empty.")
        if group.get("output_activations"):
            raise ValueError(f"quantization_config.{where}.output_activations is not supported.")
        weights = group.get("weights")
        if not weights:
            raise ValueError(f"quantization_config.{where}.weights is missing (weight "
                             "quantization is required).")
        self.format = group.get("format") or default_format
        self.type = check_field(weights, _METHOD, "type", ("float", "int"))
        if self.type == "float":
            self._parse_fp8(where, weights, group.get("input_activations"))
        else:
            self._parse_int(where, weights, group.get("input_activations"))

    def _parse_fp8(self, where, weights, acts) -> None:
        check_field({"format": self.format}, _METHOD, "format", ("float-quantized",))
        check_field(weights, _METHOD, "num_bits", (8,))
        self.strategy = check_field(weights, _METHOD, "strategy", ("tensor", "channel"))
        check_field(weights, _METHOD, "symmetric", (True,), True)
        self.act = None
        if acts:
            check_field(acts, _METHOD, "type", ("float",))
            check_field(acts, _METHOD, "num_bits", (8,))
            dynamic = acts.get("dynamic", False)
            strategy = acts.get("strategy")
            if (strategy, dynamic) not in (("tensor", False), ("token", True)):
                raise ValueError(f"quantization_config.{where}.input_activations: strategy="
                                 f"{strategy!r} with dynamic={dynamic!r} is not supported; "
                                 "supported: static 'tensor' or dynamic 'token'.")
            self.act = "static" if strategy == "tensor" else "dynamic"

    def _parse_int(self, where, weights, acts) -> None:
        check_field({"format": self.format}, _METHOD, "format", ("pack-quantized",))
        self.num_bits = check_field(weights, _METHOD, "num_bits", (4, 8))
        self.strategy = check_field(weights, _METHOD, "strategy", ("group", "channel"))
        self.symmetric = check_field(weights, _METHOD, "symmetric", (True, False), True)
        self.group_size = weights.get("group_size") if self.strategy == "group" else -1
        if not isinstance(self.group_size, int) or (self.group_size <= 0
                                                    and self.strategy == "group"):
            raise ValueError(f"quantization_config.{where}.weights.group_size="
                             f"{weights.get('group_size')!r} must be a positive integer.")
        self.actorder = check_field(weights, _METHOD, "actorder",
                                    (None, "group", "weight", "static", "dynamic"))
        if acts:
            raise ValueError(f"quantization_config.{where}.input_activations must be null for "
                             "int weights (only W4A16 / W8A16 are supported).")


class CompressedTensorsConfig(QuantizationConfig):
    name = _METHOD

    def __init__(self, schemes: list[_Scheme], ignore: list[str],
                 kv_cache_scheme: Optional[dict[str, Any]]) -> None:
        self.schemes = schemes
        self.ignore = ignore
        self.kv_cache_scheme = kv_cache_scheme

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CompressedTensorsConfig":
        for field in ("sparsity_config", "transform_config"):
            if config.get(field):
                raise ValueError(f"quantization_config.{field} is not supported (only dense "
                                 "quantized weights).")
        groups = config.get("config_groups")
        kv_scheme = config.get("kv_cache_scheme")
        if kv_scheme is not None:
            check_kv_cache_scheme(kv_scheme)
        if groups is None and kv_scheme is not None:
            groups = {}  # a KV-cache-only checkpoint: float weights
        if not isinstance(groups, dict) or not (groups or kv_scheme):
            raise ValueError("quantization_config.config_groups is missing or empty.")
        fmt = config.get("format") or ""
        schemes = [_Scheme(name, group, fmt) for name, group in groups.items()]
        return cls(schemes, list(config.get("ignore") or []), kv_scheme)

    def _scheme_for(self, name: str) -> Optional[_Scheme]:
        if _matches(name, [p for p in self.ignore if p != "Linear"]):
            return None
        for scheme in self.schemes:
            if _matches(name, scheme.targets):
                return scheme
        return None

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        names = checkpoint_names(prefix)
        schemes = [self._scheme_for(n) for n in names]
        if not all_or_none(prefix, self.name, [s is not None for s in schemes]):
            return None
        if any(s is not schemes[0] for s in schemes):
            raise ValueError(f"{self.name}: the parts of layer {prefix} belong to different "
                             "config_groups; this engine needs them quantized alike.")
        scheme = schemes[0]
        if scheme.type == "float":
            return Fp8CheckpointLinearMethod(per_channel=scheme.strategy == "channel",
                                             static_input=scheme.act == "static",
                                             weight_only=scheme.act is None)
        from vllm.model_executor.layers.quantization.int_weights import (
            CompressedTensorsWNA16Method)
        return CompressedTensorsWNA16Method(scheme.num_bits, scheme.group_size,
                                            scheme.symmetric, scheme.actorder is not None,
                                            prefix)

    def weight_summary(self) -> str:
        parts = []
        for s in self.schemes:
            if s.type == "float":
                parts.append(f"fp8 {s.strategy} weights, {s.act or 'no'} activation scales")
            else:
                parts.append(f"int{s.num_bits} group {s.group_size} "
                             f"{'sym' if s.symmetric else 'asym'}")
        if self.kv_cache_scheme is not None:
            parts.append("fp8 KV cache scales")
        return f"{self.name} ({'; '.join(parts)})"
