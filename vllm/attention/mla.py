"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over a latent paged KV cache.

Each token's keys and values are one compressed latent `c` (`kv_lora_rank` wide,
after `kv_a_layernorm`) plus a rope key `k_pe` (`qk_rope_head_dim`, shared by all
heads). The cache stores exactly that, `[c | k_pe]` per token: one "head" of
`kv_lora_rank + qk_rope_head_dim` and no separate V (ModelConfig.use_mla sizes it; on
CPU the per-layer tensor is `[1, 1, num_slots, L + R]`), instead of
`2 * heads * head_dim` for the expanded K and V.

`kv_b_proj` expands a latent into per-head `k_nope` (W_UK) and `v` (W_UV):
- prefills expand their own tokens' (and a cached context's) latents and run plain
  attention with q = [q_nope | q_pe], k = [k_nope | k_pe];
- decode rows absorb the weights instead ("weight absorption"): q_nope @ W_UK gives a
  query in latent space, scored against the cached `[c | k_pe]` rows directly, and the
  probability-weighted sum of latents goes through W_UV afterwards. A decode then reads
  only the latent cache and does `heads * (nope + v) * L` work once per query instead of
  per context token. `absorb=False` expands the context for decodes too (the reference
  and the benchmark's baseline).

The runner's metadata is the CPU backend's (`TorchSDPAMetadata`: slots, decode rows,
prefills); an fp8 cache (`--kv-cache-dtype fp8`) holds the latent quantized with the
layer's `k_scale` and every read dequantizes it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.fp8_kv import dequantize_kv, is_fp8, quantize_kv
from vllm.attention.layer import extract_layer_index
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.kernels import bound_kernel


@CustomOp.register("mla_attention")
class MLAAttention(CustomOp):
    """forward(q [T, heads, nope + rope], kv_c [T, L], k_pe [T, R]) -> [T, heads * v].

    `forward_native` serves the CPU (and CUDA) backend's metadata; Gaudi binds its own
    forward (vllm/hpu/mla.py: padded buckets, flat paged attention over the latent)."""

    def __init__(self, num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, kv_lora_rank: int, scale: float, kv_b_proj: nn.Module,
                 prefix: str = "", absorb: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.head_size = kv_lora_rank + qk_rope_head_dim
        """Width of the one cached "head" per token."""
        self.scale = scale
        self.absorb = absorb
        # Not a submodule: the projection belongs to the attention block (its weights
        # are loaded and named there); this layer only reads them.
        self._kv_b_proj = (kv_b_proj,)
        self._absorbed: tuple[torch.Tensor, ...] = ()
        self._absorbed_key: Optional[tuple] = None
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.layer_name = prefix
        self.layer_idx = extract_layer_index(prefix) if prefix else 0

    # ------------------------------------------------------------ weights
    def w_uk_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, nope, L], W_UV [heads, v, L]): views of kv_b_proj's weight."""
        weight = getattr(self._kv_b_proj[0], "weight", None)
        if weight is None or not weight.is_floating_point() or weight.element_size() < 2:
            raise ValueError(f"{self.layer_name}: weight absorption needs kv_b_proj in a float "
                             "dtype (this checkpoint's kv_b_proj is quantized).")
        w = weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim,
                        self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def expand(self, latent: torch.Tensor, k_pe: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents [S, L] and rope keys [S, R] -> k [S, heads, nope + R], v [S, heads, v]."""
        kv = self._kv_b_proj[0](latent).view(-1, self.num_heads,
                                             self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat((k_nope, k_pe[:, None, :].expand(-1, self.num_heads, -1)), dim=-1)
        return k, v

    # ------------------------------------------------------------ forward
    def forward_native(self, q: torch.Tensor, kv_c: torch.Tensor,
                       k_pe: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        if ctx is None or ctx.attn_metadata is None:
            k, v = self.expand(kv_c, k_pe)
            return self.sdpa(q, k, v, None, causal=True)
        kv_cache = ctx.kv_caches[self.layer_idx] if ctx.kv_caches else None
        if not isinstance(kv_cache, torch.Tensor) or not hasattr(ctx.attn_metadata,
                                                                 "decode_rows"):
            raise ValueError("MLA (DeepSeek-V2/V3) runs on the CPU backend's paged cache only "
                             "on this platform.")
        md = ctx.attn_metadata
        cache = kv_cache.view(-1, self.head_size)
        latent = torch.cat((kv_c, k_pe), dim=-1)
        if is_fp8(cache.dtype):
            latent = quantize_kv(latent, self.k_scale, cache.dtype)
            cache.view(torch.uint8).index_copy_(0, md.slot_mapping, latent.view(torch.uint8))
            latent = dequantize_kv(latent, self.k_scale, q.dtype)
            kv_c, k_pe = latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        else:
            cache.index_copy_(0, md.slot_mapping, latent)
        out = torch.empty(q.shape[0], self.num_heads * self.v_head_dim, dtype=q.dtype,
                          device=q.device)
        nd = md.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], cache, md)
        for seq in md.prefills:
            s, e = seq.query_start, seq.query_start + seq.query_len
            if seq.context_len == 0:
                k, v = self.expand(kv_c[s:e], k_pe[s:e])
                out[s:e] = self.sdpa(q[s:e], k, v, None, causal=True)
            else:
                rows = self._read(cache, seq.slots, q.dtype)
                k, v = self.expand(rows[:, :self.kv_lora_rank], rows[:, self.kv_lora_rank:])
                out[s:e] = self.sdpa(q[s:e], k, v, seq.mask, causal=False)
        return out

    def _read(self, cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rows = cache.index_select(0, slots)
        return dequantize_kv(rows, self.k_scale, dtype) if is_fp8(rows.dtype) else rows

    def _decode(self, q: torch.Tensor, cache: torch.Tensor, md) -> torch.Tensor:
        """One query row per decode against its cached context (`md.decode_rows`)."""
        n = q.shape[0]
        if not self.absorb:
            ctx, bias = self._gather_context(cache, md, q)
            return self._decode_expanded(q, ctx, bias)
        w_uk, w_uv_t = self._absorbed_weights()
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [n, heads, L]
        q_full = torch.cat((q_lat, q_pe), dim=-1)                    # [n, heads, L + R]
        o_lat = self._latent_attention(q_full, cache, md)            # [n, heads, L]
        out = torch.bmm(o_lat.transpose(0, 1), w_uv_t).transpose(0, 1)  # [n, heads, v]
        return out.reshape(n, self.num_heads * self.v_head_dim)

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, nope, L], W_UV^T [heads, L, v]) as contiguous copies, made again
        when kv_b_proj's weight changes (reload, sleep/wake): batched matmuls over the
        strided views of the weight copy them on every call (7-10x slower at decode
        sizes on CPU)."""
        weight = self._kv_b_proj[0].weight
        key = (weight.data_ptr(), weight._version, weight.dtype)
        if self._absorbed_key != key:
            w_uk, w_uv = self.w_uk_uv()
            self._absorbed = (w_uk.contiguous(), w_uv.transpose(1, 2).contiguous())
            self._absorbed_key = key
        return self._absorbed

    def _latent_attention(self, q_full: torch.Tensor, cache: torch.Tensor,
                          md) -> torch.Tensor:
        """softmax(q_full . [c | k_pe] * scale) . c over each row's cached context.

        Where the platform has a paged decode kernel (model_executor/kernels.py; the
        CPU's native one) it does it straight from the block table, with the latent as
        both K and V (one KV head shared by all query heads): its first kv_lora_rank
        output features are the weighted latents. Elsewhere, torch ops over the
        gathered context."""
        n = q_full.shape[0]
        decode = bound_kernel("paged_decode_attention")
        if decode is not None and cache.is_contiguous():
            table, lens = md.decode_rows
            out = torch.empty(n, self.num_heads * self.head_size, dtype=q_full.dtype)
            latent = cache.view(1, 1, -1, self.head_size).expand(2, 1, -1, self.head_size)
            scale = self.k_scale if is_fp8(cache.dtype) else 1.0
            if decode(q_full.reshape(n, -1), latent, table.to(torch.int32),
                      lens.to(torch.int32), self.num_heads, md.block_size, self.scale, out,
                      scale, scale):
                return out.view(n, self.num_heads, self.head_size)[..., :self.kv_lora_rank]
        ctx, bias = self._gather_context(cache, md, q_full)
        scores = torch.bmm(q_full, ctx.transpose(1, 2)).float() * self.scale + bias
        probs = torch.softmax(scores, dim=-1).to(q_full.dtype)       # [n, heads, width]
        return torch.bmm(probs, ctx[..., :self.kv_lora_rank])

    def _gather_context(self, cache: torch.Tensor, md, q: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(latent rows [n, width, L + R] of each row's context padded to the longest,
        float32 bias [n, 1, width]: 0 for context, -inf for padding)."""
        table, lens = md.decode_rows
        n, width = q.shape[0], int(lens.max())
        pos = torch.arange(width)[None, :].expand(n, width)
        valid = pos < lens[:, None]
        pos = torch.where(valid, pos, 0)
        slots = table.gather(1, pos // md.block_size) * md.block_size + pos % md.block_size
        ctx = self._read(cache, slots.reshape(-1).to(q.device), q.dtype).view(n, width, -1)
        bias = torch.zeros(n, 1, width, dtype=torch.float32, device=q.device)
        bias.masked_fill_(~valid.to(q.device)[:, None, :], float("-inf"))
        return ctx, bias

    def _decode_expanded(self, q: torch.Tensor, ctx: torch.Tensor,
                         bias: torch.Tensor) -> torch.Tensor:
        """Decode without absorption: every context latent expanded to K and V."""
        n, width, _ = ctx.shape
        k, v = self.expand(ctx[..., :self.kv_lora_rank].reshape(n * width, -1),
                            ctx[..., self.kv_lora_rank:].reshape(n * width, -1))
        k = k.view(n, width, self.num_heads, -1).transpose(1, 2)     # [n, heads, width, dk]
        v = v.view(n, width, self.num_heads, -1).transpose(1, 2)
        scores = torch.matmul(q[:, :, None, :], k.transpose(-1, -2)).float() * self.scale
        scores = scores + bias[:, :, None, :]
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out = torch.matmul(probs, v)                                  # [n, heads, 1, v]
        return out.reshape(n, self.num_heads * self.v_head_dim)

    def sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """q [T, heads, dk], k [S, heads, dk], v [S, heads, dv] -> [T, heads * dv]."""
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0), attn_mask=mask, is_causal=causal,
            scale=self.scale)
        return out.squeeze(0).transpose(0, 1).reshape(q.shape[0], -1)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, latent={self.kv_lora_rank}+{self.qk_rope_head_dim}, "
                f"v={self.v_head_dim}, absorb={self.absorb}")
