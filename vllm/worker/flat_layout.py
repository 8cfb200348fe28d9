"""The token-major, unpadded batch layout of the CPU and GPU runners.

Every scheduled request contributes its new tokens as consecutive rows, in the
order the runner chose. The first `num_row_wise` requests are attended row by row
(one query row against its paged context: every decode, and on CPU the short
prefills the native kernel takes); the others are SDPA prefills, described by
`PrefillSeq`. See vllm/attention/backends/torch_sdpa.py for the metadata built from
this and why row-wise requests come first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import numpy as np
import torch

from vllm.attention.backends.torch_sdpa import PrefillSeq, build_metadata
from vllm.worker.model_runner_base import ForwardPass
from vllm.worker.request_state import CachedRequestState


@dataclass
class FlatLayout:
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    """KV cache slot of each row (block id * block_size + offset)."""
    row_offsets: list[int] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    decode_seq_lens: Optional[np.ndarray] = None
    """[row-wise rows] tokens each row attends to (its own included), or None."""
    decode_block_table: Optional[np.ndarray] = None
    """[row-wise rows, max blocks] block ids of each row's request, or None."""
    prefills: list[PrefillSeq] = field(default_factory=list)
    prefill_block_ids: list[list[int]] = field(default_factory=list)
    logits_indices: list[int] = field(default_factory=list)
    """Row of each sampling request's last new token (with k draft tokens: its last
    k + 1 rows, the rows that verify them)."""
    sample_req_ids: list[str] = field(default_factory=list)
    """The request of each logits row (repeated for its verification rows)."""


def order_batch(requests: Mapping[str, CachedRequestState], num_scheduled: Mapping[str, int],
                is_row_wise: Callable[[str, int], bool]) -> tuple[list[str], int]:
    """(request order, how many of them are row-wise): decodes first, shortest
    context first (the torch backend groups decodes of similar length), then the
    other row-wise requests, then the SDPA prefills, each in scheduling order."""
    decodes, short, rest = [], [], []
    for r, n in num_scheduled.items():
        (decodes if n == 1 else short if is_row_wise(r, n) else rest).append(r)
    decodes.sort(key=lambda r: requests[r].num_computed_tokens)
    return decodes + short + rest, len(decodes) + len(short)


def build_flat_layout(requests: Mapping[str, CachedRequestState], req_ids: list[str],
                      num_scheduled: Mapping[str, int], num_row_wise: int,
                      block_size: int, num_drafts: Mapping[str, int] = {},
                      group: int = 0) -> FlatLayout:
    """Rows for `req_ids` (in that order), the first `num_row_wise` of them row-wise;
    a request with num_drafts[r] = k draft tokens (already after its known tokens in
    `token_ids`) gets logits at its last k + 1 rows. Slots and block tables are those
    of KV cache group `group` (vllm/kv_cache_spec.py)."""
    bs = block_size
    out = FlatLayout()
    row_lens: list[int] = []
    row_tables: list[tuple[list[int], int]] = []  # (block ids, rows) per row-wise request
    offset = 0
    for i, req_id in enumerate(req_ids):
        st = requests[req_id]
        n = num_scheduled[req_id]
        start = st.num_computed_tokens
        table = st.block_ids if group == 0 else st.group_table(group)
        if n == 1:
            # One token: plain ints are cheaper than numpy for a single element.
            out.token_ids.append(st.token_ids[start])
            out.positions.append(start)
            out.slots.append(table[start // bs] * bs + start % bs)
        else:
            out.token_ids.extend(st.token_ids[start:start + n])
            out.positions.extend(range(start, start + n))
            block_ids = np.asarray(table, dtype=np.int64)
            p = np.arange(start, start + n)
            out.slots.extend((block_ids[p // bs] * bs + p % bs).tolist())
        if i < num_row_wise:
            # Row r of this request attends to positions [0, start + r].
            row_lens.extend(range(start + 1, start + n + 1))
            row_tables.append((table, n))
        else:
            out.prefills.append(PrefillSeq(query_start=offset, query_len=n, context_len=start))
            out.prefill_block_ids.append(table)
        if start + n == st.num_tokens:
            k = num_drafts.get(req_id, 0)
            out.logits_indices.extend(range(offset + n - 1 - k, offset + n))
            out.sample_req_ids.extend([req_id] * (k + 1))
        out.row_offsets.append(offset)
        out.num_tokens.append(n)
        offset += n
    if row_lens:
        out.decode_seq_lens = np.asarray(row_lens, dtype=np.int64)
        out.decode_block_table = row_block_table(row_tables, out.decode_seq_lens, bs)
    return out


def decode_first_layout(requests: Mapping[str, CachedRequestState],
                        num_new: Mapping[str, int], block_size: int,
                        is_row_wise: Callable[[str, int], bool]
                        ) -> tuple[FlatLayout, list[str]]:
    """(layout, request order), row-wise requests first: a pass outside the
    scheduler's step (a draft model's)."""
    req_ids, num_row_wise = order_batch(requests, num_new, is_row_wise)
    return build_flat_layout(requests, req_ids, num_new, num_row_wise, block_size), req_ids


def row_block_table(tables: list[tuple[list[int], int]], seq_lens: np.ndarray,
                    block_size: int) -> np.ndarray:
    """[rows, max_blocks] int64: each request's block ids (as many as its longest row
    needs) repeated for each of its rows, zero padded."""
    width = -(-int(seq_lens.max()) // block_size)
    table = np.zeros((len(seq_lens), width), dtype=np.int64)
    row = 0
    for blocks, count in tables:
        needed = -(-int(seq_lens[row + count - 1]) // block_size)
        table[row:row + count, :needed] = blocks[:needed]
        row += count
    return table


def flat_forward_pass(flat: FlatLayout, req_ids: list[str], block_size: int,
                      device: torch.device, native: bool,
                      to_device: Callable[[list[int]], torch.Tensor]) -> ForwardPass:
    """The pass of a flat layout: torch_sdpa metadata (native: the CPU kernel's form);
    `platform_data` is the list of sampling logits rows. `to_device` turns a list of
    ints into an int64 tensor on the device."""
    md = build_metadata(to_device(flat.slots), flat.decode_block_table, flat.decode_seq_lens,
                        flat.prefills, flat.prefill_block_ids, block_size, device,
                        native=native)
    return ForwardPass(
        input_ids=to_device(flat.token_ids), positions=to_device(flat.positions),
        attn_metadata=md, req_ids=req_ids, row_offsets=flat.row_offsets,
        num_tokens=flat.num_tokens, num_rows=len(flat.token_ids),
        sample_req_ids=flat.sample_req_ids, platform_data=flat.logits_indices)


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                   head_size: int, num_parts: int = 2) -> tuple[int, int, int, int]:
    """torch_sdpa's head-major per-layer cache: [2, kv_heads, slots, head_size] (a
    gather of slots gives each head's keys as one matrix); MLA's latent cache has one
    part and one head: [1, 1, slots, kv_lora_rank + rope] (vllm/attention/mla.py)."""
    return (num_parts, num_kv_heads, num_blocks * block_size, head_size)
