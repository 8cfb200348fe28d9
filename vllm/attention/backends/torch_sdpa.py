"""Paged attention from plain torch ops: the CPU (and fallback CUDA) backend.

The runner orders the batch decode-first: rows with one new token ("decodes") come
first and are handled together by gathering each sequence's blocks; the remaining
sequences ("prefills", a whole prompt or a chunk of one) are handled one by one,
with a plain causal SDPA when nothing precedes them in the cache, and an explicit
mask over the gathered context otherwise. Masks and gather indices are built once
per step (in the metadata) and shared by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    query_start: int
    query_len: int
    context_len: int
    """Tokens of this sequence already in the cache before this step."""
    block_ids: torch.Tensor | None = None
    """Block ids covering context + query (only when context_len > 0)."""
    mask: torch.Tensor | None = None
    """[query_len, context_len + query_len] bool, True = may attend."""


@dataclass
class TorchSDPAMetadata:
    slot_mapping: torch.Tensor
    """[num_tokens] cache slot each new token's K/V is written to."""
    num_decodes: int
    block_size: int
    decode_block_tables: torch.Tensor | None = None
    """[num_decodes, max_blocks] block ids (padded with 0, masked out)."""
    decode_bias: torch.Tensor | None = None
    """[num_decodes, 1, 1, max_blocks * block_size] 0 or -inf."""
    prefills: list[PrefillSeq] = field(default_factory=list)


def build_metadata(slot_mapping: torch.Tensor, decode_block_tables: list[list[int]],
                   decode_seq_lens: list[int], prefills: list[PrefillSeq],
                   prefill_block_ids: list[list[int]], block_size: int,
                   device: torch.device | str) -> TorchSDPAMetadata:
    md = TorchSDPAMetadata(slot_mapping=slot_mapping, num_decodes=len(decode_seq_lens),
                           block_size=block_size, prefills=prefills)
    if decode_seq_lens:
        max_blocks = max(len(b) for b in decode_block_tables)
        table = torch.zeros(len(decode_block_tables), max_blocks, dtype=torch.long)
        for i, blocks in enumerate(decode_block_tables):
            table[i, :len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        lens = torch.tensor(decode_seq_lens, dtype=torch.long)
        pos = torch.arange(max_blocks * block_size)
        bias = torch.zeros(len(decode_seq_lens), max_blocks * block_size)
        bias.masked_fill_(pos[None, :] >= lens[:, None], float("-inf"))
        md.decode_block_tables = table.to(device)
        md.decode_bias = bias.view(len(decode_seq_lens), 1, 1, -1).to(device)
    for seq, blocks in zip(prefills, prefill_block_ids):
        if seq.context_len == 0:
            continue
        total = seq.context_len + seq.query_len
        seq.block_ids = torch.tensor(blocks[:-(-total // block_size)], dtype=torch.long,
                                     device=device)
        q_pos = torch.arange(seq.query_len, device=device)[:, None] + seq.context_len
        k_pos = torch.arange(total, device=device)[None, :]
        seq.mask = k_pos <= q_pos
    return md


class TorchSDPABackendImpl:
    """forward(layer, q, k, v, kv_cache, metadata): see vllm.attention.layer.Attention."""

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, md: TorchSDPAMetadata) -> torch.Tensor:
        num_tokens = query.shape[0]
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        q = query.view(num_tokens, hq, d)
        k = key.view(num_tokens, hkv, d)
        v = value.view(num_tokens, hkv, d)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        k_cache.index_copy_(0, md.slot_mapping, k)
        v_cache.index_copy_(0, md.slot_mapping, v)
        out = torch.empty_like(q)
        nd = md.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, md, layer)
        for seq in md.prefills:
            s, e = seq.query_start, seq.query_start + seq.query_len
            if seq.context_len == 0:
                out[s:e] = _sdpa(q[s:e], k[s:e], v[s:e], None, layer.scale, causal=True)
            else:
                total = seq.context_len + seq.query_len
                kk = _gather_seq(k_cache, seq.block_ids, md.block_size)[:total]
                vv = _gather_seq(v_cache, seq.block_ids, md.block_size)[:total]
                out[s:e] = _sdpa(q[s:e], kk, vv, seq.mask, layer.scale, causal=False)
        return out.view(num_tokens, hq * d)

    @staticmethod
    def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                md: TorchSDPAMetadata, layer) -> torch.Tensor:
        """One query per sequence against its gathered blocks; GQA without repeating K/V."""
        b = q.shape[0]
        hkv, d = layer.num_kv_heads, layer.head_size
        groups = layer.num_heads // hkv
        table = md.decode_block_tables
        bs = md.block_size
        kk = k_cache.view(-1, bs, hkv, d)[table].view(b, -1, hkv, d).permute(0, 2, 3, 1)
        vv = v_cache.view(-1, bs, hkv, d)[table].view(b, -1, hkv, d).transpose(1, 2)
        qq = q.view(b, hkv, groups, d)
        scores = torch.matmul(qq, kk).float() * layer.scale  # [b, hkv, groups, L]
        scores = scores + md.decode_bias.view(b, 1, 1, -1)
        probs = torch.softmax(scores, dim=-1).to(vv.dtype)
        return torch.matmul(probs, vv).reshape(b, hkv * groups, d)


def _gather_seq(cache: torch.Tensor, block_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    h, d = cache.shape[1], cache.shape[2]
    return cache.view(-1, block_size, h, d)[block_ids].reshape(-1, h, d)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          scale: float, causal: bool) -> torch.Tensor:
    """[T, H, D] inputs -> [T, Hq, D]; GQA handled by SDPA's enable_gqa."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0), attn_mask=mask, is_causal=causal, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1)
