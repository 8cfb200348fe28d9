"""The Triton attention backend: CUDA's default (`--attention-backend TRITON_ATTN`).

One kernel call per layer attends every query row of the step, whatever it is: a
decode, a whole prompt, or a prompt chunk after a cached prefix, mixed in any order
(vllm/attention/ops/triton_unified_attention.py). Before it, a second kernel writes
the step's new K/V into the paged cache (triton_reshape_and_cache.py). The cache
layout is torch_sdpa's (`[2, kv_heads, slots, head_size]`), so both backends size
and allocate it the same way.

The metadata is four tensors whose *shapes* are all a kernel launch depends on: the
slot of each new token, the query start of each sequence, its length after the
step, and its block table. That is what lets a CUDA graph replay one captured step
for any batch of at most its size (vllm/worker/cuda_graphs.py): the runner pads the
step to a captured token count with rows whose slot is -1 (nothing written) and
sequences with no query rows (nothing read).

Sliding windows, logit soft-caps, ALiBi, attention sinks and fp8 caches with their
scales are all handled in the kernel. Encoder-only layers (no KV cache) keep torch ops.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from vllm.attention.ops.encoder_attention import encoder_attention


@dataclass
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor
    """[num_tokens] int64 cache slot of each row's new K/V; -1: a padding row."""
    query_start_loc: torch.Tensor
    """[num_seqs + 1] int32: sequence s owns rows [query_start_loc[s], [s + 1])."""
    seq_lens: torch.Tensor
    """[num_seqs] int32: tokens of each sequence after this step (context + new)."""
    block_table: torch.Tensor
    """[num_seqs, max_blocks] int32 block ids of each sequence."""
    block_size: int
    seqs: list[tuple[int, int]] = field(default_factory=list)
    """(first row, rows) of each real sequence, on the host: encoder-only attention."""


@dataclass
class TritonInputs:
    """The host-side (numpy) arrays of the metadata, before they reach the device;
    padded to fixed shapes by CUDA graph replay, uploaded as they are otherwise."""
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_table: np.ndarray
    seqs: list[tuple[int, int]]

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


def build_triton_inputs(slots: Sequence[int], query_lens: Sequence[int],
                        seq_lens: Sequence[int], block_ids: Sequence[Sequence[int]],
                        block_size: int) -> TritonInputs:
    """The arrays for sequences laid out one after another (row order = sequence
    order): query_lens[s] new rows, seq_lens[s] tokens after the step, and the block
    ids (at least as many as seq_lens[s] needs) of each."""
    qsl = np.zeros(len(query_lens) + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(np.asarray(query_lens, dtype=np.int64))
    lens = np.asarray(seq_lens, dtype=np.int32)
    width = max(1, -(-int(lens.max()) // block_size)) if len(lens) else 1
    table = np.zeros((len(lens), width), dtype=np.int32)
    for s, (blocks, n) in enumerate(zip(block_ids, lens)):
        need = -(-int(n) // block_size)
        table[s, :need] = blocks[:need]
    seqs = [(int(qsl[s]), int(q)) for s, q in enumerate(query_lens)]
    return TritonInputs(slot_mapping=np.asarray(slots, dtype=np.int64), query_start_loc=qsl,
                        seq_lens=lens, block_table=table, seqs=seqs)


def upload(inputs: TritonInputs, block_size: int,
           to_device: Callable[[np.ndarray], torch.Tensor]) -> TritonAttentionMetadata:
    """The metadata of `inputs`, each array copied by `to_device` (the runner's
    pinned, non-blocking copy)."""
    return TritonAttentionMetadata(
        slot_mapping=to_device(inputs.slot_mapping),
        query_start_loc=to_device(inputs.query_start_loc), seq_lens=to_device(inputs.seq_lens),
        block_table=to_device(inputs.block_table), block_size=block_size, seqs=inputs.seqs)


class TritonAttentionBackendImpl:
    """forward(layer, q, k, v, kv_cache, metadata): see vllm.attention.layer.Attention."""

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, md: TritonAttentionMetadata) -> torch.Tensor:
        from vllm.attention.ops.triton_reshape_and_cache import reshape_and_cache
        from vllm.attention.ops.triton_unified_attention import unified_attention
        t = query.shape[0]
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        if getattr(layer, "attention_chunk_size", None) is not None:
            raise NotImplementedError("chunked local attention (Llama 4) is not in the Triton "
                                      "kernel yet; use --attention-backend TORCH_SDPA.")
        reshape_and_cache(key.view(t, hkv, d), value.view(t, hkv, d), kv_cache,
                          md.slot_mapping, layer.k_scale, layer.v_scale)
        out = torch.empty(t, hq, d, dtype=query.dtype, device=query.device)
        unified_attention(query.view(t, hq, d), kv_cache, out, md.query_start_loc,
                          md.seq_lens, md.block_table, md.block_size, layer.scale,
                          sliding_window=layer.sliding_window,
                          softcap=layer.logits_soft_cap, alibi_slopes=layer.alibi_slopes,
                          k_scale=layer.k_scale, v_scale=layer.v_scale,
                          sinks=getattr(layer, "sinks", None))
        return out.view(t, hq * d)

    def forward_encoder_only(self, layer, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, md: TritonAttentionMetadata) -> torch.Tensor:
        """Bidirectional attention within each (whole) sequence, no KV cache."""
        return encoder_attention(layer, query, key, value, md.seqs)
