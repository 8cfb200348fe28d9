"""MLA (DeepSeek-V2/V3) on Gaudi: the latent cache under the HPU runner's buckets.

The layer's `HPUKVCache` holds the latent `[c | k_pe]` as its key tensor
(`[(num_blocks + 1) * block_size, 1, kv_lora_rank + rope]`, pad block last) and an
empty value tensor: V is the latent itself. Shapes come from the bucket only, so the
graphs are the ones warmup built.

- prompt: the rows' latents are expanded through kv_b_proj (and, with a context, the
  context blocks' cached latents too) and attend with explicit float32 scores under
  the valid-key mask (`prompt_attention_masked`: q/k and v widths differ in MLA);
- decode: flat paged attention over the latent blocks with the absorbed query
  `[q_nope @ W_UK | q_pe]`, the latent serving as both K and V; the first
  kv_lora_rank features of the result go through W_UV.
"""
from __future__ import annotations

from typing import Any

import torch

from vllm.attention.fp8_kv import is_fp8
from vllm.forward_context import get_forward_context
from vllm.hpu.paged_attn import (dequantize_kv, flat_paged_attention, gather_context,
                                 prompt_attention_masked, quantize_kv)


def _scales(layer: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, 1 / scale) of an fp8 latent cache as tensors, built once per layer."""
    scales = getattr(layer, "_hpu_latent_scales", None)
    if scales is None or scales[0].device != device:
        scales = (torch.tensor(layer.k_scale, dtype=torch.float32, device=device),
                  torch.tensor(1.0 / layer.k_scale, dtype=torch.float32, device=device))
        layer._hpu_latent_scales = scales
    return scales


def mla_attention_hpu(self: Any, q: torch.Tensor, kv_c: torch.Tensor,
                      k_pe: torch.Tensor) -> torch.Tensor:
    """The `mla_attention` op on Gaudi (see the module docstring)."""
    ctx = get_forward_context()
    md = None if ctx is None else ctx.attn_metadata
    if md is None:
        k, v = self.expand(kv_c, k_pe)
        return self.sdpa(q, k, v, None, causal=True)
    kv_cache = ctx.kv_caches[self.layer_idx] if ctx.kv_caches else None
    has_cache = kv_cache is not None and kv_cache.key_cache.numel() > 0
    cache = kv_cache.key_cache if has_cache else None
    scales = None
    latent = torch.cat((kv_c, k_pe), dim=-1)
    if has_cache:
        if is_fp8(cache.dtype):
            scales = _scales(self, q.device)
            latent = quantize_kv(latent, scales[1], cache.dtype)
        rows = latent.unsqueeze(1)
        if scales is not None:  # fp8 rows as bytes, as write_to_kv_cache (no fp8 index_copy_)
            cache.view(torch.uint8).index_copy_(0, md.slot_mapping, rows.view(torch.uint8))
        else:
            cache.index_copy_(0, md.slot_mapping, rows)
        if scales is not None:
            latent = dequantize_kv(latent, scales[0], q.dtype)
    if md.is_prompt:
        return _prompt(self, q, latent, cache, md, scales)
    if cache is None:
        raise ValueError("HPU decode attention needs the KV cache.")
    w_uk, w_uv = self.w_uk_uv()
    q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
    q_full = torch.cat((torch.einsum("bhd,hdl->bhl", q_nope, w_uk), q_pe), dim=-1)
    kv_scales = None if scales is None else (scales[0], scales[0])
    out = flat_paged_attention(q_full, cache, cache, md.flat_pa, self.scale,
                               kv_scales=kv_scales)
    out = torch.einsum("bhl,hvl->bhv", out[..., :self.kv_lora_rank], w_uv)
    return out.reshape(q.shape[0], self.num_heads * self.v_head_dim)


def _prompt(self: Any, q: torch.Tensor, latent: torch.Tensor, cache, md, scales
            ) -> torch.Tensor:
    """Padded prompt rows [B*T]: expanded K/V of the new (and context) latents."""
    batch = md.query_lens.shape[0]
    seq = q.shape[0] // batch
    lat = self.kv_lora_rank
    new = torch.arange(seq, device=q.device)[None, :].expand(batch, seq)
    valid_new = new < md.query_lens[:, None]
    if md.context_block_list is not None:
        if cache is None:
            raise ValueError("HPU prompt attention with a context needs the KV cache.")
        past = gather_context(cache, md.context_block_list, md.block_size)[:, :, 0]
        if scales is not None:
            past = dequantize_kv(past, scales[0], q.dtype)
        latent = torch.cat((past, latent.view(batch, seq, -1)), dim=1)
        past_pos = torch.arange(past.shape[1], device=q.device)[None, :].expand(batch, -1)
        q_pos = md.context_lens[:, None] + new
        k_pos = torch.cat((past_pos, q_pos), dim=1)
        k_valid = torch.cat((past_pos < md.context_lens[:, None], valid_new), dim=1)
    else:
        latent = latent.view(batch, seq, -1)
        q_pos = k_pos = new
        k_valid = valid_new
    flat = latent.reshape(-1, latent.shape[-1])
    k, v = self.expand(flat[:, :lat], flat[:, lat:])
    k = k.view(batch, -1, self.num_heads, k.shape[-1])
    v = v.view(batch, -1, self.num_heads, v.shape[-1])
    qb = q.view(batch, seq, self.num_heads, q.shape[-1])
    out = prompt_attention_masked(qb, k, v, q_pos, k_pos, k_valid, self.scale, None, None)
    return out.reshape(q.shape[0], self.num_heads * self.v_head_dim)
