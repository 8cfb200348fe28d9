"""The HPU attention backend: static-shape paged attention for padded buckets.

The HPU runner never mixes phases in one forward pass: a pass is either a prompt
batch `[B, T]` (B sequences right-padded to T new tokens, flattened to B*T rows)
or a decode batch of B sequences with one token each. The metadata carries only
tensors whose shapes come from the bucket, plus constants of the engine
(`is_prompt`, `block_size`), so an HPU graph keyed on it is reused for every batch
padded to the same bucket.

- prompt, no context: causal FusedSDPA over the new tokens with per-row valid
  lengths (`prompt_attention`);
- prompt with context (prefix-cache hit, later chunk of a chunked prefill): the
  cached K/V of the context blocks in front of the new tokens, explicit mask
  (`prompt_attention_with_context`);
- decode: flat paged attention over the batch's blocks (`flat_paged_attention`).

K/V of every row are written to the cache first; padding rows write into the pad
block (the extra last block of each cache), so they never touch real data.

The cache of a layer is an `HPUKVCache`: K and V are two separate tensors, not the
two halves of one `[2, ...]` tensor. Inside a captured HPU graph an in-place write
(`index_copy_`) into a view of a bigger tensor makes the graph depend on the view's
base and offset; writing into whole tensors keeps each cache write a plain graph
input/output, which is what Gaudi's graph capture handles without copies.

With an fp8 cache (vllm/attention/fp8_kv.py) the new K/V are cast to fp8 with the
layer's scales before the write, and every attention reads them back dequantized:
the prompt's own new K/V too (`_fp8_kv`), as on CPU.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from vllm import envs
from vllm.attention.fp8_kv import is_fp8
from vllm.hpu.paged_attn import (FlatPAMetadata, check_fsdpa_gqa,
                                               dequantize_kv, flat_paged_attention,
                                               quantize_kv,
                                               encoder_prompt_attention,
                                               gather_context, prompt_attention,
                                               prompt_attention_masked,
                                               prompt_attention_with_context,
                                               write_to_kv_cache)


class HPUKVCache(NamedTuple):
    """One layer's KV cache: two separate `[(num_blocks + 1) * block_size, kv_heads,
    head_size]` tensors (slot-major; the last block is the pad block).

    A NamedTuple so an HPU graph keyed on the layer caches sees two tensors (hashed by
    shape), and so code written for the old `[2, ...]` tensor (`cache[0]`, `cache[1]`)
    reads the same.
    """
    key_cache: torch.Tensor
    value_cache: torch.Tensor


class HPUAttentionMetadata(NamedTuple):
    """Per-pass attention inputs; every size is a tensor shape (see module doc).

    A NamedTuple (like FlatPAMetadata): Gaudi's HPU graph cache keys its graphs on
    the inputs' hash, taken element by element through tuples, by shape for tensors.
    """
    is_prompt: bool
    block_size: int
    slot_mapping: torch.Tensor
    """[num_rows] int64 cache slot of each row's K/V (pad-block slots for padding)."""
    query_lens: Optional[torch.Tensor] = None
    """Prompt: [B] valid new tokens per row (1 for dummy rows, so no row is empty)."""
    context_block_list: Optional[torch.Tensor] = None
    """Prompt with context: [B, C] physical context blocks (pad block beyond a row's)."""
    context_lens: Optional[torch.Tensor] = None
    """Prompt with context: [B] tokens already in the cache before this pass."""
    flat_pa: Optional[FlatPAMetadata] = None
    """Decode: flat paged attention metadata for the (B, N) bucket."""
    mm_groups: Optional[torch.Tensor] = None
    """Prompt of a model attending images both ways: [B, T] image of each new position
    (-1 text): tokens of one image see each other (the masked prompt path)."""
    context_mm_groups: Optional[torch.Tensor] = None
    """The same for the [B, C * block_size] gathered context positions."""


class HPUAttentionImpl:
    """forward(layer, q, k, v, kv_cache, metadata), as `vllm.attention.Attention` calls it.

    `kv_cache` is the layer's `HPUKVCache`, or None during the profile run (prompt
    passes only). How FusedSDPA gets grouped-query K/V (VLLM_HPU_FSDPA_GQA) is read
    once, when the backend is built.
    """

    def __init__(self) -> None:
        self.fsdpa_gqa = check_fsdpa_gqa(envs.VLLM_HPU_FSDPA_GQA)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: Optional[HPUKVCache], md: HPUAttentionMetadata) -> torch.Tensor:
        rows = query.shape[0]
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        q = query.view(rows, hq, d)
        k = key.view(rows, hkv, d)
        v = value.view(rows, hkv, d)
        has_cache = kv_cache is not None and kv_cache.key_cache.numel() > 0
        scales = None
        if has_cache and is_fp8(kv_cache.key_cache.dtype):
            k, v, scales = _fp8_kv(layer, k, v, kv_cache, md.slot_mapping)
        elif has_cache:
            write_to_kv_cache(k, v, kv_cache.key_cache, kv_cache.value_cache,
                              md.slot_mapping)
        slopes = getattr(layer, "alibi_slopes", None)
        sinks = getattr(layer, "sinks", None)
        chunk = getattr(layer, "attention_chunk_size", None)
        masked = (getattr(layer, "sliding_window", None) is not None
                  or getattr(layer, "logits_soft_cap", None) is not None
                  or slopes is not None or sinks is not None or chunk is not None)
        if md.is_prompt and (masked or md.mm_groups is not None):
            out = self._prompt_masked(q, k, v, kv_cache if has_cache else None, md, layer,
                                      scales)
        elif md.is_prompt:
            out = self._prompt(q, k, v, kv_cache if has_cache else None, md, layer.scale,
                               self.fsdpa_gqa, scales)
        else:
            if not has_cache:
                raise ValueError("HPU decode attention needs the KV cache.")
            out = flat_paged_attention(q, kv_cache.key_cache, kv_cache.value_cache, md.flat_pa,
                                       layer.scale,
                                       getattr(layer, "logits_soft_cap", None),
                                       getattr(layer, "sliding_window", None), slopes,
                                       scales, sinks, chunk)
        return out.reshape(rows, hq * d)

    def forward_encoder_only(self, layer, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, md: HPUAttentionMetadata) -> torch.Tensor:
        """Bidirectional attention within each padded prompt of the bucket, no KV cache
        (encoder-only pooling models: whole prompts, never a decode)."""
        if not md.is_prompt or md.context_block_list is not None:
            raise ValueError("encoder-only attention runs on whole prompts only (no decode, "
                             "no cached context).")
        rows = query.shape[0]
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        batch = md.query_lens.shape[0]
        seq = rows // batch
        out = encoder_prompt_attention(query.view(batch, seq, hq, d),
                                       key.view(batch, seq, hkv, d),
                                       value.view(batch, seq, hkv, d), md.query_lens,
                                       layer.scale, self.fsdpa_gqa)
        return out.reshape(rows, hq * d)

    @staticmethod
    def _prompt_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       kv_cache: Optional[HPUKVCache], md: HPUAttentionMetadata,
                       layer, scales=None) -> torch.Tensor:
        """Prompt pass of a soft-capped, sliding-window, ALiBi or sink layer (FusedSDPA
        takes no per-head bias or sink), or of a model whose image tokens attend both
        ways: explicit scores over the same (context +) new tokens `_prompt` uses."""
        slopes = getattr(layer, "alibi_slopes", None)
        sinks = getattr(layer, "sinks", None)
        batch = md.query_lens.shape[0]
        seq = q.shape[0] // batch
        qb = q.view(batch, seq, q.shape[1], q.shape[2])
        kb = k.view(batch, seq, k.shape[1], k.shape[2])
        vb = v.view(batch, seq, v.shape[1], v.shape[2])
        new = torch.arange(seq, device=q.device)[None, :].expand(batch, seq)
        if md.context_block_list is None:
            return prompt_attention_masked(qb, kb, vb, new, new, torch.ones_like(new,
                                                                            dtype=torch.bool),
                                           layer.scale, layer.logits_soft_cap,
                                           layer.sliding_window, slopes, sinks,
                                           md.mm_groups, md.mm_groups,
                                           getattr(layer, "attention_chunk_size", None))
        if kv_cache is None:
            raise ValueError("HPU prompt attention with a context needs the KV cache.")
        past_k = gather_context(kv_cache.key_cache, md.context_block_list, md.block_size)
        past_v = gather_context(kv_cache.value_cache, md.context_block_list, md.block_size)
        if scales is not None:
            past_k = dequantize_kv(past_k, scales[0], q.dtype)
            past_v = dequantize_kv(past_v, scales[1], q.dtype)
        past = torch.arange(past_k.shape[1], device=q.device)[None, :].expand(batch, -1)
        q_pos = md.context_lens[:, None] + new
        k_pos = torch.cat((past, q_pos), dim=1)
        k_valid = torch.cat((past < md.context_lens[:, None],
                             torch.ones_like(new, dtype=torch.bool)), dim=1)
        k_groups = (None if md.mm_groups is None else
                    torch.cat((md.context_mm_groups, md.mm_groups), dim=1))
        return prompt_attention_masked(qb, torch.cat((past_k, kb), 1), torch.cat((past_v, vb), 1),
                                       q_pos, k_pos, k_valid, layer.scale,
                                       layer.logits_soft_cap, layer.sliding_window, slopes,
                                       sinks, md.mm_groups, k_groups,
                                       getattr(layer, "attention_chunk_size", None))

    @staticmethod
    def _prompt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: Optional[HPUKVCache], md: HPUAttentionMetadata,
                scale: float, gqa_mode: str = "native", scales=None) -> torch.Tensor:
        """[B*T, H, D] rows -> [B, T, H, D] batch (the shapes give B and T)."""
        batch = md.query_lens.shape[0]
        seq = q.shape[0] // batch
        qb = q.view(batch, seq, q.shape[1], q.shape[2])
        kb = k.view(batch, seq, k.shape[1], k.shape[2])
        vb = v.view(batch, seq, v.shape[1], v.shape[2])
        if md.context_block_list is None:
            return prompt_attention(qb, kb, vb, md.query_lens, scale, gqa_mode)
        if kv_cache is None:
            raise ValueError("HPU prompt attention with a context needs the KV cache.")
        return prompt_attention_with_context(qb, kb, vb, kv_cache.key_cache,
                                             kv_cache.value_cache,
                                             md.context_block_list, md.context_lens,
                                             md.block_size, scale, gqa_mode, scales)


def _fp8_kv(layer, k: torch.Tensor, v: torch.Tensor, kv_cache: HPUKVCache,
            slot_mapping: torch.Tensor):
    """Write K/V to an fp8 cache; (K, V as the cache gives them back, the layer's
    (k_scale, v_scale) tensors for the reads)."""
    scales = getattr(layer, "_hpu_kv_scales", None)
    if scales is None or scales[0].device != k.device:
        as_t = lambda x: torch.tensor(x, dtype=torch.float32, device=k.device)  # noqa: E731
        scales = (as_t(layer.k_scale), as_t(layer.v_scale), as_t(1.0 / layer.k_scale),
                  as_t(1.0 / layer.v_scale))
        layer._hpu_kv_scales = scales  # built once: constant inputs of every graph
    cache_dtype = kv_cache.key_cache.dtype
    kq = quantize_kv(k, scales[2], cache_dtype)
    vq = quantize_kv(v, scales[3], cache_dtype)
    write_to_kv_cache(kq, vq, kv_cache.key_cache, kv_cache.value_cache, slot_mapping)
    return (dequantize_kv(kq, scales[0], k.dtype), dequantize_kv(vq, scales[1], v.dtype),
            scales[:2])
