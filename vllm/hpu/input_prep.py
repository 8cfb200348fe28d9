"""Padded, bucket-shaped model inputs for the HPU runner.

The runner describes each scheduled sequence once (`PromptSeq` / `DecodeSeq`, in
physical block ids) and these builders turn a group of them into one forward pass
padded to a bucket:

- prompt bucket (B, T, C): rows `[B, T]` flattened to B*T, tokens and positions
  right-padded with 0, padded rows and dummy sequences writing into the pad block,
  context blocks `[B, C]` padded with the pad block;
- decode bucket (B, 1, N): B rows, flat paged attention metadata over N blocks.

Warmup builds its dummy batches through the same functions, so a warmed bucket
has exactly the input signature (shapes, dtypes, constants) serving will use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from vllm.hpu.attention import HPUAttentionMetadata
from vllm.hpu.paged_attn import build_flat_pa_metadata
from vllm.hpu.bucketing import Bucket


@dataclass
class PromptSeq:
    """New tokens of one sequence in a prompt pass (a whole prompt or a chunk)."""
    req_id: Optional[str]
    token_ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    """Cache slot of each new token (physical block id * block_size + offset)."""
    context_len: int
    """Tokens of this sequence already in the cache (prefix-cache hit, earlier chunks)."""
    context_blocks: list[int]
    """Physical ids of the blocks holding the context: ceil(context_len / block_size)."""
    sample: bool = False
    """True when this pass reaches the end of the known tokens (a token is sampled)."""
    mm_groups: Optional[np.ndarray] = None
    """[context_len + query_len] image of each position (-1 text) when its model attends
    images both ways (vllm/multimodal/inputs.py bidirectional_span_ids); None: none."""

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def num_context_blocks(self) -> int:
        return len(self.context_blocks)


@dataclass
class DecodeSeq:
    """One new token of one sequence in a decode pass."""
    req_id: Optional[str]
    token_id: int
    position: int
    slot: int
    seq_len: int
    """Tokens in the cache after this token is written (attention span)."""
    block_table: list[int]
    """Physical ids of the ceil(seq_len / block_size) blocks of the sequence."""
    sample: bool = True


@dataclass
class HPUBatch:
    """One padded forward pass."""
    is_prompt: bool
    bucket: Bucket
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: HPUAttentionMetadata
    logits_indices: torch.Tensor
    """[B]: the row of each batch entry's last new token (dummy entries: their first row)."""
    seqs: list
    """The real PromptSeq / DecodeSeq entries, in batch order (rows 0..len-1)."""
    row_stride: int
    """Rows per batch entry (T for prompts, 1 for decodes)."""

    @property
    def num_real(self) -> int:
        return len(self.seqs)


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def pad_slots(pad_block_id: int, block_size: int, count: int) -> np.ndarray:
    """Slots inside the pad block for `count` padded rows (spread over its slots)."""
    return pad_block_id * block_size + np.arange(count, dtype=np.int64) % block_size


def build_prompt_batch(seqs: list[PromptSeq], bucket: Bucket, block_size: int,
                       pad_block_id: int, device: torch.device,
                       bidirectional: bool = False) -> HPUBatch:
    """Stack prompt sequences into the [B, T] (+ [B, C] context) bucket.
    `bidirectional` (a model attending images both ways): the image of every new and
    context position, -1 for text and padding, in every pass of the model (one graph
    per bucket whether or not a batch holds images)."""
    b, t, c = bucket
    if len(seqs) > b or any(s.query_len > t or s.num_context_blocks > c for s in seqs):
        raise ValueError(f"prompt sequences do not fit bucket {tuple(bucket)}: "
                         f"{[(s.query_len, s.num_context_blocks) for s in seqs]}")
    ids = np.zeros((b, t), dtype=np.int64)
    pos = np.zeros((b, t), dtype=np.int64)
    slots = np.tile(pad_slots(pad_block_id, block_size, t), (b, 1))
    query_lens = np.ones(b, dtype=np.int64)  # dummy rows: one (discarded) token
    logits_rows = np.arange(b, dtype=np.int64) * t
    for i, s in enumerate(seqs):
        n = s.query_len
        ids[i, :n], pos[i, :n], slots[i, :n] = s.token_ids, s.positions, s.slots
        query_lens[i] = n
        logits_rows[i] += n - 1
    md = HPUAttentionMetadata(is_prompt=True, block_size=block_size,
                              slot_mapping=_tensor(slots.reshape(-1), device),
                              query_lens=_tensor(query_lens, device))
    if c > 0:
        ctx_blocks = np.full((b, c), pad_block_id, dtype=np.int64)
        ctx_lens = np.zeros(b, dtype=np.int64)
        for i, s in enumerate(seqs):
            ctx_blocks[i, :s.num_context_blocks] = s.context_blocks
            ctx_lens[i] = s.context_len
        md = md._replace(context_block_list=_tensor(ctx_blocks, device),
                         context_lens=_tensor(ctx_lens, device))
    if bidirectional:
        md = md._replace(**_image_groups(seqs, b, t, c * block_size, device))
    return HPUBatch(is_prompt=True, bucket=bucket, input_ids=_tensor(ids.reshape(-1), device),
                    positions=_tensor(pos.reshape(-1), device), attn_metadata=md,
                    logits_indices=_tensor(logits_rows, device), seqs=list(seqs), row_stride=t)


def _image_groups(seqs: list[PromptSeq], b: int, t: int, past: int,
                  device: torch.device) -> dict[str, torch.Tensor]:
    """mm_groups [B, T] of the new positions and, with a context, context_mm_groups
    [B, C * block_size] of the cached ones (-1: text, padding)."""
    new = np.full((b, t), -1, dtype=np.int64)
    old = np.full((b, past), -1, dtype=np.int64)
    for i, s in enumerate(seqs):
        if s.mm_groups is not None:
            new[i, :s.query_len] = s.mm_groups[s.context_len:s.context_len + s.query_len]
            old[i, :s.context_len] = s.mm_groups[:s.context_len]
    out = {"mm_groups": _tensor(new, device)}
    if past:
        out["context_mm_groups"] = _tensor(old, device)
    return out


def build_decode_batch(seqs: list[DecodeSeq], bucket: Bucket, block_size: int,
                       pad_block_id: int, contiguous_pa: bool, dtype: torch.dtype,
                       device: torch.device) -> HPUBatch:
    """B decode rows plus flat paged attention metadata over the bucket's N blocks."""
    b, _, n = bucket
    if len(seqs) > b:
        raise ValueError(f"{len(seqs)} decode sequences do not fit bucket {tuple(bucket)}.")
    ids = np.zeros(b, dtype=np.int64)
    pos = np.zeros(b, dtype=np.int64)
    slots = pad_slots(pad_block_id, block_size, b)
    for i, s in enumerate(seqs):
        ids[i], pos[i], slots[i] = s.token_id, s.position, s.slot
    flat = build_flat_pa_metadata([s.block_table for s in seqs], [s.seq_len for s in seqs],
                                  block_size, b, n, pad_block_id, contiguous=contiguous_pa,
                                  dtype=dtype, device=device)
    md = HPUAttentionMetadata(is_prompt=False, block_size=block_size,
                              slot_mapping=_tensor(slots, device), flat_pa=flat)
    return HPUBatch(is_prompt=False, bucket=bucket, input_ids=_tensor(ids, device),
                    positions=_tensor(pos, device), attn_metadata=md,
                    logits_indices=torch.arange(b, device=device), seqs=list(seqs),
                    row_stride=1)


def decode_blocks_needed(seqs: list[DecodeSeq], block_size: int, contiguous_pa: bool) -> int:
    """The decode bucket's block dimension a batch needs.

    Contiguous PA reads `cache[:N]`, so N must pass the highest physical id in use;
    otherwise N counts the blocks of all sequences.
    """
    if contiguous_pa:
        return max(max(s.block_table[:-(-s.seq_len // block_size)]) for s in seqs) + 1
    return sum(-(-s.seq_len // block_size) for s in seqs)


def dependency_levels(seqs: list[PromptSeq], block_size: int) -> list[list[PromptSeq]]:
    """Order prompts so that no pass reads a context block a later pass writes.

    The scheduler caches a block's hash when it allocates it, so a prompt admitted
    later in the same step can hit blocks another prompt of this step is still
    computing. Within one pass that is fine (every layer writes the pass's K/V
    before attending); across passes the writer must run first. Level 0 reads
    nothing written this step; level k reads blocks written at level k - 1 or
    below. (Decodes never read blocks written by this step's prompts, so the
    decode pass can run first.)
    """
    writer: dict[int, int] = {}
    for i, seq in enumerate(seqs):
        for block in set((seq.slots // block_size).tolist()):
            writer[block] = i
    deps = [{writer[b] for b in seq.context_blocks if writer.get(b, i) != i}
            for i, seq in enumerate(seqs)]
    levels = [0] * len(seqs)
    for _ in range(len(seqs) + 1):
        changed = False
        for i, needs in enumerate(deps):
            level = max((levels[j] + 1 for j in needs), default=0)
            if level != levels[i]:
                levels[i], changed = level, True
        if not changed:
            break
    else:
        raise ValueError("prompt sequences read each other's blocks in a cycle.")
    return [[s for s, lv in zip(seqs, levels) if lv == level]
            for level in range(max(levels, default=-1) + 1)]

