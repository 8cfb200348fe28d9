"""LoRAModelManager: the adapters of one model runner, on the host and in device slots.

Two LRU caches, as in vLLM:
- host: up to `max_cpu_loras` loaded adapters (`LoRAModel`, host tensors), so an
  adapter that comes back after a while is not read from disk again;
- device: `max_loras` slots in every LoRA layer. A step's adapters are made resident
  (`activate`), evicting the least recently used slot that this step does not need;
  the scheduler never puts more distinct adapters in one step than there are slots.

The manager wraps the model's adaptable linear layers (every linear layer of the
decoder blocks) in `LoRALinear` once, after the weights are loaded and packed.
"""
from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

from vllm.lora.layers import LoRALinear
from vllm.lora.peft_loader import LoRALayerSpec, LoRAModel, load_adapter
from vllm.lora.punica import LoRABatch
from vllm.lora.request import LoRARequest

logger = logging.getLogger(__name__)

_DECODER_LAYER = re.compile(r"(^|\.)layers\.\d+\.")


def layer_spec(module: nn.Module) -> LoRALayerSpec:
    """Input size and output slices of one (TP size 1) linear layer of ours."""
    from vllm.model_executor.layers.linear import (MergedColumnParallelLinear,
                                                   QKVParallelLinear)
    in_features = getattr(module, "input_size_per_partition", None) or module.input_size
    if isinstance(module, QKVParallelLinear):
        return LoRALayerSpec(in_features, (module.q_size, module.kv_size, module.kv_size))
    if isinstance(module, MergedColumnParallelLinear):
        return LoRALayerSpec(in_features, tuple(module.output_sizes))
    out = getattr(module, "output_size_per_partition", None) or module.output_size
    return LoRALayerSpec(in_features, (out,))


class LoRAModelManager:

    def __init__(self, model: nn.Module, max_loras: int, max_cpu_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, static_shapes: bool) -> None:
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.batch = LoRABatch(max_loras, static_shapes, dtype)
        self.layers: dict[str, LoRALinear] = {}
        self.specs: dict[str, LoRALayerSpec] = {}
        self.targets: dict[str, tuple[str, int]] = {}
        self._wrap(model, device)
        self._host: OrderedDict[int, LoRAModel] = OrderedDict()
        self._slots: OrderedDict[int, int] = OrderedDict()  # lora id -> slot, LRU first
        self._slot_owner: list[Optional[int]] = [None] * max_loras
        self.num_slot_loads = 0
        """Adapters copied into a device slot so far (swaps included)."""

    def _wrap(self, model: nn.Module, device: torch.device) -> None:
        from vllm.model_executor.layers.linear import LinearBase
        packed = getattr(type(model), "packed_modules_mapping", {})
        found = [(name, module) for name, module in model.named_modules()
                 if isinstance(module, LinearBase) and _DECODER_LAYER.search(name)]
        if not found:
            raise ValueError(f"{type(model).__name__} has no linear layers LoRA can adapt.")
        for name, module in found:
            spec = layer_spec(module)
            parent_name, _, attr = name.rpartition(".")
            wrapper = LoRALinear(module, spec, self.batch, self.max_loras, self.max_rank,
                                 self.dtype, device)
            setattr(model.get_submodule(parent_name), attr, wrapper)
            self.layers[name] = wrapper
            self.specs[name] = spec
            for k, sub in enumerate(packed.get(attr, [attr])):
                self.targets[f"{parent_name}.{sub}"] = (name, k)
        logger.info("LoRA: %d layers wrapped (%d slots, max rank %d, %s schedule).",
                    len(found), self.max_loras, self.max_rank,
                    "masked static-shape" if self.batch.static_shapes else "per-slot segment")

    # ------------------------------------------------------------ host cache
    def add_adapter(self, request: LoRARequest) -> bool:
        """Load (and check) an adapter into the host cache; False if already there."""
        cached = self._host.get(request.lora_int_id)
        if cached is not None and cached.lora_request.lora_path == request.lora_path \
                and cached.lora_request.generation == request.generation:
            self._host.move_to_end(request.lora_int_id)
            return False
        model = load_adapter(request, self.specs, self.targets, self.max_rank, self.dtype)
        if cached is not None:  # same id, new files: the old weights must go everywhere
            self._evict_slot(request.lora_int_id)
        self._host[request.lora_int_id] = model
        while len(self._host) > self.max_cpu_loras:
            old_id, _ = self._host.popitem(last=False)
            logger.debug("LoRA %d evicted from the host cache", old_id)
        return True

    def remove_adapter(self, lora_id: int) -> bool:
        found = self._host.pop(lora_id, None) is not None
        return self._evict_slot(lora_id) or found

    def list_adapters(self) -> set[int]:
        return set(self._host) | set(self._slots)

    # ---------------------------------------------------------- device slots
    def _evict_slot(self, lora_id: int) -> bool:
        slot = self._slots.pop(lora_id, None)
        if slot is None:
            return False
        for layer in self.layers.values():
            layer.set_slot(slot, None)
        self._slot_owner[slot] = None
        return True

    def activate(self, requests: Sequence[LoRARequest]) -> dict[int, int]:
        """Make the step's adapters resident; returns lora id -> slot."""
        wanted: dict[int, LoRARequest] = {}
        for req in requests:
            wanted.setdefault(req.lora_int_id, req)
        if len(wanted) > self.max_loras:
            raise ValueError(f"{len(wanted)} distinct LoRA adapters in one step, but only "
                             f"max_loras={self.max_loras} slots.")
        for lora_id, req in wanted.items():
            if lora_id in self._slots:
                cached = self._host.get(lora_id)
                if cached is None or (cached.lora_request.lora_path == req.lora_path and
                                      cached.lora_request.generation == req.generation):
                    self._slots.move_to_end(lora_id)
                    continue
            self._load_into_slot(req, set(wanted))
        return {lora_id: self._slots[lora_id] for lora_id in wanted}

    def _load_into_slot(self, request: LoRARequest, keep: set[int]) -> None:
        self.add_adapter(request)
        model = self._host[request.lora_int_id]
        self._evict_slot(request.lora_int_id)
        if None in self._slot_owner:
            slot = self._slot_owner.index(None)
        else:
            victim = next(i for i in self._slots if i not in keep)
            slot = self._slots.pop(victim)
        for name, layer in self.layers.items():
            layer.set_slot(slot, model.layers.get(name))
        self._slot_owner[slot] = request.lora_int_id
        self._slots[request.lora_int_id] = slot
        self.num_slot_loads += 1

    # --------------------------------------------------------------- mapping
    def set_token_slots(self, token_slots: np.ndarray, device: torch.device) -> None:
        """The pass's per-row slot (-1: base, and padding rows) for the LoRA layers."""
        if self.batch.static_shapes:
            self.batch.set_indices(torch.from_numpy(token_slots).to(device))
        else:
            self.batch.set_segments(token_slots, device)

    def set_token_slot_tensor(self, token_slots: torch.Tensor) -> None:
        """Masked schedule: the per-row slot tensor (fixed, bucketed shape), e.g. an
        input of a captured HPU graph."""
        self.batch.set_indices(token_slots)

    def clear_mapping(self) -> None:
        self.batch.clear()

    def step_token_slots(self, lora_requests: Sequence[Optional[LoRARequest]],
                         num_rows: Sequence[int]) -> np.ndarray:
        """Make a step's adapters resident and return each row's slot (-1: base).

        `lora_requests[i]` is the adapter of the i-th request of the batch (None for
        the base model), which contributes `num_rows[i]` consecutive rows.
        """
        slot_of = self.activate([r for r in lora_requests if r is not None])
        per_request = np.fromiter((slot_of[r.lora_int_id] if r is not None else -1
                                   for r in lora_requests), dtype=np.int64,
                                  count=len(lora_requests))
        return np.repeat(per_request, np.asarray(num_rows, dtype=np.int64))


def create_lora_manager(model: nn.Module, vllm_config, device: torch.device,
                        static_shapes: bool) -> Optional[LoRAModelManager]:
    """The runner's manager when LoRA is enabled (wrapping the model's layers)."""
    lc = vllm_config.lora_config
    if lc is None:
        return None
    return LoRAModelManager(model, lc.max_loras, lc.max_cpu_loras, lc.max_lora_rank,
                            lc.lora_torch_dtype, device, static_shapes)
