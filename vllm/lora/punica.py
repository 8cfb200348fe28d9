"""Batched LoRA for one step: every token row gets its own adapter's delta.

A step's rows carry a slot index each (-1: the base model, no delta). The delta of
row t is `(x_t A_s^T) B_s^T` for its slot s: a *shrink* to the adapter rank, then an
*expand* back to the layer's output (Punica's SGMV/BGMV split). Two schedules:

- segments (CPU, CUDA): one shrink+expand per active slot over the rows of that slot
  (a slice when they are contiguous, else a gather and an index_add). Work is
  proportional to the adapted rows and each adapter's true rank.
- active-dense (CPU, CUDA, small passes such as decode steps): the A (and B) of the
  pass's active slots concatenated at their true ranks, every row shrunk by all of
  them, the other slots' columns zeroed by the row's slot mask, one expand. Five ops
  per layer however many adapters the pass mixes: at decode sizes the per-slot op
  overhead, not the arithmetic, is what costs.
- masked (HPU): static shapes. Every row is shrunk by all `max_loras` slots at once
  (one matmul against the stacked, rank-padded A), the columns of the other slots are
  zeroed by the row's one-hot slot mask, and one matmul against the stacked B expands.
  Shapes depend only on the bucket and the configuration, so changing which adapters
  are loaded, or the mix of a batch, compiles nothing.

`LoRABatch` holds the per-step mapping; the runner sets it before the forward (its
lifetime is one forward) and every LoRA layer of the model reads the same object.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch

Rows = Union[slice, torch.Tensor]


class LoRABatch:
    """Which slot each row of the current forward uses."""

    def __init__(self, max_loras: int, static_shapes: bool, dtype: torch.dtype) -> None:
        self.max_loras = max_loras
        self.static_shapes = static_shapes
        self.dtype = dtype
        self.segments: list[tuple[int, Rows]] = []
        self.one_hot: Optional[torch.Tensor] = None
        self.active_slots: tuple[int, ...] = ()
        """Active-dense schedule: the pass's slots, in the column order of `one_hot`."""
        self.token_slots: Optional[np.ndarray] = None
        """Each row's slot (-1: base) of a host-scheduled pass, for native callers (the
        fused CPU decode layer adds the deltas itself)."""
        self.weights_version = 0
        """Bumped whenever a layer's slot weights change (native callers hold pointers)."""

    DENSE_MAX_ROWS = 256
    """Passes up to this many rows use the active-dense schedule (unless one slice)."""

    @property
    def active(self) -> bool:
        return self.one_hot is not None or bool(self.segments)

    def clear(self) -> None:
        self.segments = []
        self.one_hot = None
        self.active_slots = ()
        self.token_slots = None

    def set_segments(self, token_slots: np.ndarray, device: torch.device) -> None:
        """Host-side schedule of a pass (once per pass): active-dense for small passes,
        else the rows of each active slot."""
        self.clear()
        if token_slots.size == 0 or token_slots.max() < 0:
            return
        self.token_slots = np.ascontiguousarray(token_slots, dtype=np.int64)
        slots = np.unique(token_slots[token_slots >= 0])
        rows0 = np.flatnonzero(token_slots == slots[0])
        single_slice = slots.size == 1 and rows0[-1] - rows0[0] + 1 == rows0.size
        if token_slots.size <= self.DENSE_MAX_ROWS and not single_slice:
            self.active_slots = tuple(slots.tolist())
            mask = token_slots[:, None] == slots[None, :]
            self.one_hot = torch.from_numpy(mask).to(device=device, dtype=self.dtype)
            return
        for slot in slots.tolist():
            rows = np.flatnonzero(token_slots == slot)
            if rows[-1] - rows[0] + 1 == rows.size:
                self.segments.append((slot, slice(int(rows[0]), int(rows[-1]) + 1)))
            else:
                self.segments.append((slot, torch.from_numpy(rows).to(device)))

    def set_indices(self, token_slots: torch.Tensor) -> None:
        """Masked schedule: a [rows, max_loras] one-hot (all zero for base rows). Pure
        tensor ops on a fixed shape, so it can run inside a captured graph."""
        arange = torch.arange(self.max_loras, device=token_slots.device)
        self.one_hot = (token_slots.unsqueeze(1) == arange).to(self.dtype)


def add_lora_segments(out: torch.Tensor, x: torch.Tensor, batch: LoRABatch,
                      a_slots: list[Optional[torch.Tensor]],
                      b_slots: list[Optional[torch.Tensor]]) -> torch.Tensor:
    """out[rows of s] += x[rows of s] A_s^T B_s^T for each active slot s (in place)."""
    for slot, rows in batch.segments:
        a, b = a_slots[slot], b_slots[slot]
        if a is None:
            continue
        xs = x[rows].to(a.dtype)
        delta = torch.mm(torch.mm(xs, a.t()), b.t()).to(out.dtype)
        if isinstance(rows, slice):
            out[rows] += delta
        else:
            out.index_add_(0, rows, delta)
    return out


def add_lora_active_dense(out: torch.Tensor, x: torch.Tensor, one_hot: torch.Tensor,
                          a_cat: torch.Tensor, b_cat: torch.Tensor,
                          column_slot: torch.Tensor) -> torch.Tensor:
    """out += (x A_cat^T * mask) B_cat^T, where A_cat `[sum r, in]` / B_cat `[out, sum r]`
    hold the active slots side by side and `column_slot[c]` is the one_hot column (the
    active slot) that owns shrunk column c."""
    shrunk = torch.mm(x.to(a_cat.dtype), a_cat.t())
    shrunk.mul_(one_hot.index_select(1, column_slot))
    return out.add_(torch.mm(shrunk, b_cat.t()).to(out.dtype))


def add_lora_masked(out: torch.Tensor, x: torch.Tensor, one_hot: torch.Tensor,
                    a_stacked: torch.Tensor, b_stacked: torch.Tensor) -> torch.Tensor:
    """out += mask(x A_all^T) B_all^T with A_all `[L*R, in]`, B_all `[out, L*R]`."""
    t = x.shape[0]
    num_slots = one_hot.shape[1]
    shrunk = torch.mm(x.to(a_stacked.dtype), a_stacked.t())
    shrunk = (shrunk.view(t, num_slots, -1) * one_hot.unsqueeze(2)).view(t, -1)
    return out.add_(torch.mm(shrunk, b_stacked.t()).to(out.dtype))
