"""Batch-invariant GEMM where no native kernel does it (VLLM_BATCH_INVARIANT=1).

A GEMM library picks its kernel and its blocking by the row count, so one row's
result can change with how many rows share the call: in bf16 a request's tokens
then depend on its neighbours (vLLM's batch-invariant mode removes that). The CPU
platform's native GEMM computes each row alone; elsewhere (the HPU, CPUs without
the native kernel) `row_invariant_linear` runs every GEMM as calls of exactly
`ROW_TILE` rows, the last tile zero-padded: one shape, so one kernel and one
reduction order for every row, whatever the batch. Rows never interact in a GEMM,
so a row's result is then a function of that row alone.

The cost is the padding of small calls up to a tile and one call per tile (see
benchmarks/README.md).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

ROW_TILE = 64


def row_invariant_linear(x: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed in fixed `ROW_TILE`-row calls."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    x2 = x.reshape(rows, k)
    pad = (-rows) % ROW_TILE
    if pad:
        x2 = torch.cat([x2, x2.new_zeros(pad, k)])
    out = torch.cat([F.linear(tile, weight) for tile in x2.split(ROW_TILE)])[:rows]
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.shape[0])
