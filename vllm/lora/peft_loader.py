"""Read a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors).

PEFT stores, per adapted module `M` of the HF model, `base_model.model.M.lora_A.weight`
`[r, in]` and `...lora_B.weight` `[out, r]`; the delta is `x A^T B^T * scaling` with
`scaling = alpha / r`, or `alpha / sqrt(r)` under rsLoRA (`use_rslora`), where `r` and
`alpha` may be overridden per module by `rank_pattern` / `alpha_pattern`.

Our models fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, so each adapted
HF module becomes one *slice* of one of our layers. The loader checks every tensor
against the layer it lands in (shape, rank <= max_lora_rank) and refuses what this
engine cannot apply (biases, DoRA, embeddings / lm_head, modules_to_save) with a
ValueError that names the adapter and the offending part: the server turns it into a
400 and keeps serving the other adapters.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import torch

from vllm.lora.request import LoRARequest

logger = logging.getLogger(__name__)

CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")
_PREFIX = "base_model.model."


class LoRAAdapterNotFoundError(ValueError):
    """The adapter directory or one of its files does not exist."""


@dataclass(frozen=True)
class LoRALayerSpec:
    """One linear layer that adapters may target: its input size and output slices."""
    in_features: int
    out_sizes: tuple[int, ...]


@dataclass
class LoRALayerWeights:
    """An adapter's weights for one (possibly fused) layer.

    `slices[k]` is `(A [r_k, in], B [out_k, r_k])` for slice k (scaling folded into
    B), or None when the adapter leaves that slice alone (e.g. only q and v adapted).
    """
    slices: list[Optional[tuple[torch.Tensor, torch.Tensor]]]
    out_sizes: tuple[int, ...]
    _packed: Optional[tuple[torch.Tensor, torch.Tensor]] = field(default=None, repr=False)

    @property
    def rank(self) -> int:
        return max((a.shape[0] for a, _ in filter(None, self.slices)), default=0)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(A [R, in], B [out, R])` with R = sum of the slice ranks, B block-diagonal:
        one shrink and one expand apply every slice at once."""
        if self._packed is None:
            present = [(k, a, b) for k, s in enumerate(self.slices) if s for a, b in [s]]
            a_cat = torch.cat([a for _, a, _ in present], dim=0).contiguous()
            b_full = a_cat.new_zeros(sum(self.out_sizes), a_cat.shape[0])
            col = 0
            for k, a, b in present:
                row = sum(self.out_sizes[:k])
                b_full[row:row + b.shape[0], col:col + a.shape[0]] = b
                col += a.shape[0]
            self._packed = (a_cat, b_full)
        return self._packed


@dataclass
class LoRAModel:
    """A loaded adapter: its request and its weights per layer of ours."""
    lora_request: LoRARequest
    layers: dict[str, LoRALayerWeights]

    @property
    def id(self) -> int:
        return self.lora_request.lora_int_id

    @property
    def rank(self) -> int:
        return max((w.rank for w in self.layers.values()), default=0)


def read_adapter_config(request: LoRARequest) -> dict:
    path = request.lora_path
    config_path = os.path.join(path, CONFIG_NAME)
    if not os.path.isdir(path) or not os.path.isfile(config_path):
        raise LoRAAdapterNotFoundError(
            f"Loading lora {request.lora_name} failed: No adapter found for {path} "
            f"(expected a directory with {CONFIG_NAME} and adapter_model.safetensors).")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"LoRA adapter {request.lora_name}: cannot read {CONFIG_NAME}: {e}"
                         ) from e
    if not isinstance(config, dict):
        raise ValueError(f"LoRA adapter {request.lora_name}: {CONFIG_NAME} is not an object.")
    _check_config(request.lora_name, config)
    return config


def _check_config(name: str, config: dict) -> None:
    """Refuse adapter features this engine does not apply."""
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"LoRA adapter {name}: peft_type {peft_type!r} is not supported "
                         "(only LORA).")
    refusals = (
        (config.get("bias", "none") not in (None, "none"),
         f"bias={config.get('bias')!r}: LoRA adapters with biases are not supported "
         "(train with bias='none')."),
        (bool(config.get("lora_bias")), "lora_bias=true: biases on lora_B are not supported."),
        (bool(config.get("use_dora")), "use_dora=true: DoRA adapters are not supported."),
        (bool(config.get("modules_to_save")),
         f"modules_to_save={config.get('modules_to_save')!r}: fully trained extra modules "
         "are not supported."),
        (bool(config.get("fan_in_fan_out")), "fan_in_fan_out=true is not supported."),
        (bool(config.get("target_parameters")), "target_parameters is not supported."),
        (bool(config.get("use_qalora")), "use_qalora=true is not supported."),
    )
    for refused, reason in refusals:
        if refused:
            raise ValueError(f"LoRA adapter {name}: {reason}")


def _read_tensors(request: LoRARequest) -> dict[str, torch.Tensor]:
    for fname in WEIGHT_NAMES:
        path = os.path.join(request.lora_path, fname)
        if not os.path.isfile(path):
            continue
        try:
            if fname.endswith(".safetensors"):
                from safetensors.torch import load_file
                return load_file(path, device="cpu")
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any corrupt file is the user's input
            raise ValueError(f"LoRA adapter {request.lora_name}: cannot read {fname}: {e}"
                             ) from e
    raise LoRAAdapterNotFoundError(
        f"Loading lora {request.lora_name} failed: No adapter found for "
        f"{request.lora_path} (no adapter_model.safetensors or adapter_model.bin).")


def _pattern_value(patterns: dict, module: str, default: float) -> float:
    """PEFT's rule: a key matches a module whose name ends with it at a dot boundary."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _split_key(name: str, key: str) -> tuple[str, str]:
    """'base_model.model.M.lora_A.weight' -> ('M', 'lora_A.weight')."""
    body = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
    for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B",
                 "lora_magnitude_vector"):
        marker = f".{part}"
        idx = body.find(marker + ".")
        if idx < 0 and body.endswith(marker):
            idx = len(body) - len(marker)
        if idx >= 0:
            return body[:idx], body[idx + 1:]
    raise ValueError(f"LoRA adapter {name}: unexpected tensor {key!r} (not a lora_A/lora_B "
                     "weight).")


def load_adapter(request: LoRARequest, specs: dict[str, LoRALayerSpec],
                 targets: dict[str, tuple[str, int]], max_rank: int,
                 dtype: torch.dtype) -> LoRAModel:
    """Load and check an adapter for a model whose adaptable layers are `specs`.

    `targets` maps each HF module name an adapter may adapt (e.g.
    `model.layers.0.self_attn.q_proj`) to (our layer name, slice index).
    """
    config = read_adapter_config(request)
    tensors = _read_tensors(request)
    name = request.lora_name
    embedding = next((k for k in tensors if ".lora_embedding_" in k), None)
    if embedding is not None:
        raise ValueError(f"LoRA adapter {name}: embedding adapters ({embedding}) are not "
                         "supported; adapt the linear projections only.")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, kind = _split_key(name, key)
        if kind.startswith(("lora_embedding", "lora_magnitude")):
            what = "DoRA magnitudes" if "magnitude" in kind else "embedding adapters"
            raise ValueError(f"LoRA adapter {name}: {what} ({key}) are not supported.")
        if kind.endswith(".bias"):
            raise ValueError(f"LoRA adapter {name}: biases ({key}) are not supported.")
        if kind not in ("lora_A.weight", "lora_B.weight"):
            raise ValueError(f"LoRA adapter {name}: unexpected tensor {key!r}.")
        pairs.setdefault(module, {})[kind[:6]] = tensor
    unexpected = sorted(m for m in pairs if m not in targets)
    if unexpected:
        supported = sorted({t.rsplit(".", 1)[-1] for t in targets})
        raise ValueError(
            f"LoRA adapter {name} targets modules this model cannot adapt: "
            f"{', '.join(unexpected[:4])}{' ...' if len(unexpected) > 4 else ''}. Supported "
            f"target modules: {', '.join(supported)}.")
    if not pairs:
        raise ValueError(f"LoRA adapter {name}: no lora_A/lora_B weights found.")
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    rslora = bool(config.get("use_rslora", False))
    layers: dict[str, LoRALayerWeights] = {}
    for module, ab in sorted(pairs.items()):
        layer_name, k = targets[module]
        spec = specs[layer_name]
        a, b = _checked_pair(name, module, ab, spec.in_features, spec.out_sizes[k], max_rank)
        r = a.shape[0]
        mod_alpha = _pattern_value(config.get("alpha_pattern"), module, alpha)
        scaling = mod_alpha / (math.sqrt(r) if rslora else r)
        weights = layers.setdefault(
            layer_name, LoRALayerWeights([None] * len(spec.out_sizes), spec.out_sizes))
        weights.slices[k] = (a.to(dtype).contiguous(),
                             (b.to(torch.float32) * scaling).to(dtype).contiguous())
    model = LoRAModel(request, layers)
    logger.info("Loaded LoRA adapter %s (id %d, rank %d, %d layers) from %s", name,
                request.lora_int_id, model.rank, len(layers), request.lora_path)
    return model


def _checked_pair(name: str, module: str, ab: dict[str, torch.Tensor], in_features: int,
                  out_features: int, max_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    if set(ab) != {"lora_A", "lora_B"}:
        missing = {"lora_A", "lora_B"} - set(ab)
        raise ValueError(f"LoRA adapter {name}: {module} has no {missing.pop()} weight.")
    a, b = ab["lora_A"], ab["lora_B"]
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
        raise ValueError(f"LoRA adapter {name}: {module} has inconsistent shapes lora_A "
                         f"{tuple(a.shape)}, lora_B {tuple(b.shape)}.")
    r = a.shape[0]
    if r > max_rank:
        raise ValueError(f"LoRA adapter {name}: rank {r} of {module} is larger than "
                         f"max_lora_rank={max_rank}; start the engine with a larger "
                         "--max-lora-rank.")
    if a.shape[1] != in_features or b.shape[0] != out_features:
        raise ValueError(
            f"LoRA adapter {name}: {module} expects lora_A [r, {in_features}] and lora_B "
            f"[{out_features}, r] for this model, got {tuple(a.shape)} and {tuple(b.shape)} "
            "(an adapter for another base model?).")
    return a, b
