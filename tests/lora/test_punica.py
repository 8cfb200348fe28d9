"""The two batched schedules (per-slot segments, static-shape masked) against a naive
per-row reference, and LoRALinear's slot bookkeeping."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm.lora.layers import LoRALinear
from vllm.lora.peft_loader import LoRALayerSpec, LoRALayerWeights
from vllm.lora.punica import LoRABatch

OUT_SIZES = (12, 4, 4)  # a fused q/k/v-like layer
IN = 16


class _Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(sum(OUT_SIZES), IN), requires_grad=False)

    def forward(self, x):
        return x @ self.weight.t()


def _adapter(rank: int, present: tuple[bool, ...]) -> LoRALayerWeights:
    slices = [(torch.randn(rank, IN), torch.randn(size, rank)) if p else None
              for size, p in zip(OUT_SIZES, present)]
    return LoRALayerWeights(slices, OUT_SIZES)


def _reference(x, base, adapters, token_slots):
    out = base(x)
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        row = 0
        for pair, size in zip(adapters[slot].slices, OUT_SIZES):
            if pair is not None:
                a, b = pair
                out[t, row:row + size] += (x[t] @ a.t()) @ b.t()
            row += size
    return out


@pytest.mark.parametrize("static,dense_max_rows", [(False, 0), (False, 256), (True, 0)],
                         ids=["segments", "active-dense", "masked"])
def test_batched_delta_matches_per_row_reference(static, dense_max_rows, monkeypatch):
    monkeypatch.setattr(LoRABatch, "DENSE_MAX_ROWS", dense_max_rows)
    torch.manual_seed(0)
    base = _Base()
    max_loras, max_rank = 3, 8
    batch = LoRABatch(max_loras, static, torch.float32)
    layer = LoRALinear(base, LoRALayerSpec(IN, OUT_SIZES), batch, max_loras, max_rank,
                       torch.float32, torch.device("cpu"))
    adapters = [_adapter(8, (True, True, True)), _adapter(2, (True, False, True)),
                _adapter(5, (False, True, False))]
    for slot, weights in enumerate(adapters):
        layer.set_slot(slot, weights)
    # Base rows, contiguous runs and scattered rows of every slot.
    token_slots = np.array([-1, 0, 0, 1, -1, 2, 1, 1, 0, -1, 2], dtype=np.int64)
    x = torch.randn(len(token_slots), IN)
    if static:
        batch.set_indices(torch.from_numpy(token_slots))
    else:
        batch.set_segments(token_slots, torch.device("cpu"))
        assert (batch.one_hot is not None) == bool(dense_max_rows)
    got = layer(x)
    torch.testing.assert_close(got, _reference(x, base, adapters, token_slots))
    # Clearing a slot removes its delta; an inactive batch is the base layer.
    layer.set_slot(1, None)
    adapters[1] = LoRALayerWeights([None, None, None], OUT_SIZES)
    torch.testing.assert_close(layer(x), _reference(x, base, adapters, token_slots))
    batch.clear()
    torch.testing.assert_close(layer(x), base(x))


def test_masked_shapes_do_not_depend_on_adapters():
    """The static buffers have one shape whatever the adapters' ranks."""
    batch = LoRABatch(2, True, torch.float32)
    layer = LoRALinear(_Base(), LoRALayerSpec(IN, OUT_SIZES), batch, 2, 8, torch.float32,
                       torch.device("cpu"))
    shapes = (layer.a_stacked.shape, layer.b_stacked.shape)
    layer.set_slot(0, _adapter(2, (True, True, False)))
    layer.set_slot(1, _adapter(8, (True, True, True)))
    assert (layer.a_stacked.shape, layer.b_stacked.shape) == shapes == (
        torch.Size([2 * 3 * 8, IN]), torch.Size([sum(OUT_SIZES), 2 * 3 * 8]))
