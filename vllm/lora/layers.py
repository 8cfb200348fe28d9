"""LoRALinear: a linear layer plus the adapter delta of each token of the step.

It wraps the model's own layer (replicated, column, row, or fused qkv / gate_up)
after the weights are loaded, so the layer, its quantization method and its packed
weights stay as they are; the base output is computed first and the delta is added
to it. Tensor parallelism is not supported with LoRA (refused by the config).

Adapter weights live in `max_loras` slots. With static shapes (HPU) each slot is a
rank-padded block of two stacked buffers (A `[L * K * R, in]`, B `[out, L * K * R]`,
K slices of rank R = max_lora_rank each, block-diagonal in B) whose shapes never
change; otherwise a slot holds the adapter's own packed tensors (exact ranks).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm.lora.peft_loader import LoRALayerSpec, LoRALayerWeights
from vllm.lora.punica import (LoRABatch, add_lora_active_dense, add_lora_masked,
                              add_lora_segments)


class LoRALinear(nn.Module):

    def __init__(self, base_layer: nn.Module, spec: LoRALayerSpec, batch: LoRABatch,
                 max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.spec = spec
        self.batch = batch
        self.max_rank = max_rank
        self.a_slots: list[Optional[torch.Tensor]] = [None] * max_loras
        self.b_slots: list[Optional[torch.Tensor]] = [None] * max_loras
        self._dense: dict[tuple[int, ...], Optional[tuple]] = {}
        """Active-dense operands per combination of active slots (dropped on set_slot)."""
        if batch.static_shapes:
            width = max_loras * len(spec.out_sizes) * max_rank
            self.register_buffer("a_stacked", torch.zeros(width, spec.in_features, dtype=dtype,
                                                          device=device), persistent=False)
            self.register_buffer("b_stacked", torch.zeros(sum(spec.out_sizes), width,
                                                          dtype=dtype, device=device),
                                 persistent=False)

    packable_weight = False
    """The wrapped layer packs its own weight; the wrapper has none to pack."""

    def __getattr__(self, name: str):
        """Attributes of the wrapped layer (sizes, TP info) read through the wrapper."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("_modules", {}).get("base_layer")
            if base is None:
                raise
            return getattr(base, name)

    def set_slot(self, slot: int, weights: Optional[LoRALayerWeights]) -> None:
        """Put an adapter's weights for this layer into `slot` (None: no delta)."""
        self.batch.weights_version += 1
        if not self.batch.static_shapes:
            self._dense.clear()
            packed = None if weights is None else weights.packed()
            self.a_slots[slot] = None if packed is None else packed[0].to(self.a_device)
            self.b_slots[slot] = None if packed is None else packed[1].to(self.a_device)
            return
        k_count, r = len(self.spec.out_sizes), self.max_rank
        start = slot * k_count * r
        self.a_stacked[start:start + k_count * r].zero_()
        self.b_stacked[:, start:start + k_count * r].zero_()
        if weights is None:
            return
        row = 0
        for k, (pair, size) in enumerate(zip(weights.slices, self.spec.out_sizes)):
            if pair is not None:
                a, b = pair
                col = start + k * r
                self.a_stacked[col:col + a.shape[0]].copy_(a)
                self.b_stacked[row:row + size, col:col + a.shape[0]].copy_(b)
            row += size

    @property
    def a_device(self) -> torch.device:
        weight = getattr(self.base_layer, "weight", None)
        return weight.device if weight is not None else torch.device("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:  # the Transformers backend's modules keep a batch dimension
            lead = x.shape[:-1]
            return self.forward(x.reshape(-1, x.shape[-1])).view(*lead, -1)
        out = self.base_layer(x)
        batch = self.batch
        if not batch.active:
            return out
        if batch.static_shapes:
            return add_lora_masked(out, x, batch.one_hot, self.a_stacked, self.b_stacked)
        if batch.one_hot is not None:
            dense = self._dense_operands(batch.active_slots)
            if dense is None:
                return out
            return add_lora_active_dense(out, x, batch.one_hot, *dense)
        return add_lora_segments(out, x, batch, self.a_slots, self.b_slots)

    def _dense_operands(self, slots: tuple[int, ...]) -> Optional[tuple]:
        """(A_cat, B_cat, column -> active index) of these slots; None if none adapts
        this layer."""
        if slots not in self._dense:
            present = [(j, s) for j, s in enumerate(slots) if self.a_slots[s] is not None]
            if not present:
                self._dense[slots] = None
            else:
                a_cat = torch.cat([self.a_slots[s] for _, s in present]).contiguous()
                b_cat = torch.cat([self.b_slots[s] for _, s in present], dim=1).contiguous()
                column = torch.cat([torch.full((self.a_slots[s].shape[0],), j, dtype=torch.long)
                                    for j, s in present]).to(a_cat.device)
                self._dense[slots] = (a_cat, b_cat, column)
        return self._dense[slots]
