"""Structured outputs on the logits: -inf wherever the grammar's bitmask forbids a token.

The bitmask is int32 [rows, ceil(vocab / 32)]: bit b of word w allows token 32 * w + b
(the layout xgrammar and llguidance both fill).

- `apply_token_bitmask_` is plain tensor ops with shapes fixed by (rows, vocab): the HPU
  runner applies it to a whole bucket (unconstrained and padding rows allow all), so
  each bucket keeps one compiled shape.
- `apply_grammar_bitmask` (CPU/CUDA runners) touches only the constrained rows, with
  xgrammar's native kernel on CPU tensors (about 2x the tensor-op speed there).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    shifts = _BIT_SHIFTS.get(device)
    if shifts is None:
        shifts = _BIT_SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return shifts


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, vocab_size] bool, True = allowed."""
    bits = (bitmask.unsqueeze(-1) >> _shifts(bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set forbidden tokens of each row to -inf, in place; returns `logits`."""
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    return logits.masked_fill_(~allowed, float("-inf"))


def _constrained_rows(req_ids: list[str], structured_ids: dict[str, int]
                      ) -> list[tuple[int, int]]:
    """(logits row, bitmask row) of each constrained request among `req_ids`; the j-th
    row of a request (speculative decoding: its draft-verifying rows) takes bitmask
    row structured_ids[r] + j."""
    picks: list[tuple[int, int]] = []
    seen: dict[str, int] = {}
    for i, r in enumerate(req_ids):
        if r in structured_ids:
            j = seen.get(r, 0)
            seen[r] = j + 1
            picks.append((i, structured_ids[r] + j))
    return picks


def rows_bitmask(req_ids: list[str], structured_ids: dict[str, int],
                 grammar_bitmask: Optional[np.ndarray], num_rows: int
                 ) -> Optional[torch.Tensor]:
    """The step's bitmask laid out on `num_rows` logits rows (`req_ids[i]` is row i).

    Rows of unconstrained requests and padding rows allow every token. None when no
    row is constrained: such a batch pays nothing.
    """
    if grammar_bitmask is None:
        return None
    picks = _constrained_rows(req_ids, structured_ids)
    if not picks:
        return None
    rows = torch.full((num_rows, grammar_bitmask.shape[1]), -1, dtype=torch.int32)
    dest, src = zip(*picks)
    rows[list(dest)] = torch.from_numpy(grammar_bitmask)[list(src)]
    return rows


def apply_grammar_bitmask(logits: torch.Tensor, req_ids: list[str],
                          structured_ids: dict[str, int],
                          grammar_bitmask: Optional[np.ndarray]) -> None:
    """Mask the constrained rows of `logits` ([len(req_ids), vocab]) in place."""
    if grammar_bitmask is None:
        return
    picks = _constrained_rows(req_ids, structured_ids)
    if not picks:
        return
    dest, src = (list(x) for x in zip(*picks))
    source = torch.from_numpy(grammar_bitmask)
    if logits.device.type == "cpu" and _xgrammar_cpu_kernel(logits, source, dest, src):
        return
    index = torch.tensor(dest, device=logits.device)
    sub = apply_token_bitmask_(logits.index_select(0, index),
                               source[src].to(logits.device))
    logits.index_copy_(0, index, sub)


def _xgrammar_cpu_kernel(logits: torch.Tensor, source: torch.Tensor, dest: list[int],
                         src: list[int]) -> bool:
    try:
        import xgrammar
    except ImportError:
        return False
    full = torch.full((logits.shape[0], source.shape[1]), -1, dtype=torch.int32)
    full[dest] = source[src]
    xgrammar.apply_token_bitmask_inplace(logits, full, vocab_size=logits.shape[-1],
                                         indices=dest)
    return True
