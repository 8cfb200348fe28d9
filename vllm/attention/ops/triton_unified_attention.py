"""Triton paged attention for a whole step: decodes, prompts and chunked prefills in
one launch (the CUDA backend's kernel).

Sequence s owns query rows `[query_start_loc[s], query_start_loc[s+1])`; its row i sits
at position `p = seq_lens[s] - query_len + i` and attends to the cached positions
`[max(0, p - sliding_window + 1), p]`, read through the block table from the
head-major cache `[2, num_kv_heads, num_slots, head_size]` (which already holds this
step's K/V). A decode is simply a sequence with one query row.

Tiling: a program takes BLOCK_Q query tokens of one sequence times the query heads
of one KV head (GQA heads become rows of the same `tl.dot` tile, so K/V are read once
per KV head and never repeated), and walks the keys in tiles of TILE positions,
skipping the tiles outside the causal / window range, with a float32 online softmax.
Programs find their sequence by a binary search over query_start_loc: sequence s's
query blocks are numbered from `query_start_loc[s] // BLOCK_Q + s`, so
`T // BLOCK_Q + num_seqs` programs always suffice. The grid and every argument thus
depend on shapes only, never on the values of the metadata, which is what a CUDA
graph needs (no host sync); programs whose block holds no row of a sequence (padding
sequences of length 0, rows past query_start_loc[-1]) return without touching memory.

When a batch gives too few programs to fill the GPU (batch-1 decode: one program per
KV head), the keys of each program are split into NUM_SEGMENTS ranges computed in
parallel (flash-decoding); each writes its unnormalized partial output and softmax
statistics, and a second kernel combines them. The split count is also chosen from
shapes only.

Attention sinks (GPT-OSS: one learned logit per head in the softmax denominator) start
each row's running softmax at max = sink, sum = 1 (in the first segment only, so the
split-KV combine counts it once).

fp8 caches are read as fp8 and converted to the query dtype (exact for e4m3 and e5m2
in bf16/fp16/fp32); k_scale is folded into the score scale and v_scale into the
output, so the result is attention over the dequantized cache.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Optional

import torch

from vllm.attention.ops.triton_reshape_and_cache import (HAS_TRITON, TritonKernel,
                                                         require_triton, tl, triton)

logger = logging.getLogger(__name__)

if HAS_TRITON:  # kernels may read globals only as constexpr
    _LOG2E = tl.constexpr(1.4426950408889634)
    # Running max before any key is seen: finite, so a tile whose keys are all
    # masked (exp2(-inf - m) = 0, correction exp2(0) = 1) needs no special case.
    _M_INIT = tl.constexpr(-1.0e30)
_MAX_SEGMENTS = 32


def _unified_attention_kernel(
    Q, KV, OUT, QSL, SEQ_LENS, BT, SLOPES, SINKS, SEG_ACC, SEG_ML,
    sm_scale, softcap, v_scale, window, num_seqs,
    stride_q_t, stride_q_h, stride_q_d,
    stride_o_t, stride_o_h, stride_o_d,
    stride_c_kv, stride_c_h, stride_c_s, stride_c_d,
    stride_bt,
    NUM_HEADS: tl.constexpr, QPK: tl.constexpr, QPK_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr,
    USE_SINKS: tl.constexpr, NUM_SEGMENTS: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    # The sequence of this query block: the last s whose first block <= q_block.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(QSL + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(QSL + seq)
    q_len = tl.load(QSL + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(SEQ_LENS + seq)
    context_len = seq_len - q_len

    # Rows: BLOCK_Q tokens x QPK_PAD heads of this KV head (token-major).
    rows = tl.arange(0, BLOCK_M)
    tok = local_block * BLOCK_Q + rows // QPK_PAD
    head_in_group = rows % QPK_PAD
    head = kv_head * QPK + head_in_group
    row_ok = (tok < q_len) & (head_in_group < QPK)
    q_pos = context_len + tok
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD
    q_row = (q_start + tok).to(tl.int64)
    q = tl.load(Q + q_row[:, None] * stride_q_t + head[:, None] * stride_q_h
                + d[None, :] * stride_q_d,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    if USE_ALIBI:
        slopes = tl.load(SLOPES + head, mask=head_in_group < QPK, other=0.0)

    # Key tiles this block can see, then this program's share of them.
    last_pos = tl.minimum(context_len + (local_block + 1) * BLOCK_Q, seq_len) - 1
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(context_len + local_block * BLOCK_Q - window + 1, 0)
    tile_lo = first_key // TILE
    tile_hi = last_pos // TILE + 1
    if NUM_SEGMENTS > 1:
        per_segment = (tile_hi - tile_lo + NUM_SEGMENTS - 1) // NUM_SEGMENTS
        tile_lo = tile_lo + segment * per_segment
        tile_hi = tl.minimum(tile_lo + per_segment, tile_hi)

    k_base = KV + kv_head * stride_c_h
    v_base = k_base + stride_c_kv
    table = BT + seq * stride_bt
    m_i = tl.full([BLOCK_M], _M_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_SINKS:
        # The sink is a key with score `sink` and a zero value: start the running
        # softmax from it (max = sink, sum = exp(0) = 1), in one segment only.
        if segment == 0:
            sink = tl.load(SINKS + head, mask=head_in_group < QPK, other=0.0).to(tl.float32)
            m_i = sink
            l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    for j in range(tile_lo, tile_hi):
        k_pos = j * TILE + tl.arange(0, TILE)
        k_ok = k_pos < seq_len
        block_id = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0)
        slot = block_id.to(tl.int64) * BLOCK_SIZE + k_pos % BLOCK_SIZE
        k_t = tl.load(k_base + slot[None, :] * stride_c_s + d[:, None] * stride_c_d,
                      mask=d_ok[:, None] & k_ok[None, :], other=0.0)
        v = tl.load(v_base + slot[:, None] * stride_c_s + d[None, :] * stride_c_d,
                    mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, k_t.to(q.dtype), input_precision=DOT_PRECISION) * sm_scale
        if USE_SOFTCAP:
            # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both infinities.
            e2x = tl.exp2(s * (2.0 * _LOG2E / softcap))
            s = softcap * (1.0 - 2.0 / (e2x + 1.0))
        if USE_ALIBI:
            s += slopes[:, None] * (k_pos[None, :] - q_pos[:, None]).to(tl.float32)
        allowed = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2((s - m_new[:, None]) * _LOG2E)
        alpha = tl.exp2((m_i - m_new) * _LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype),
                                             input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SEGMENTS == 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc * (v_scale / l_safe)[:, None]
        tl.store(OUT + q_row[:, None] * stride_o_t + head[:, None] * stride_o_h
                 + d[None, :] * stride_o_d, out.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        part = (q_row * NUM_HEADS + head) * NUM_SEGMENTS + segment
        tl.store(SEG_ACC + part[:, None] * HEAD_PAD + d[None, :], acc * v_scale,
                 mask=out_mask)
        tl.store(SEG_ML + part * 2, m_i, mask=row_ok)
        tl.store(SEG_ML + part * 2 + 1, l_i, mask=row_ok)


def _combine_segments_kernel(
    OUT, SEG_ACC, SEG_ML, QSL, num_seqs,
    stride_o_t, stride_o_h, stride_o_d,
    NUM_HEADS: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """One program per (row, head): merges the segments' partial softmaxes."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    if t >= tl.load(QSL + num_seqs):
        return
    seg = tl.arange(0, NUM_SEGMENTS)
    d = tl.arange(0, HEAD_PAD)
    part = (t.to(tl.int64) * NUM_HEADS + h) * NUM_SEGMENTS + seg
    m = tl.load(SEG_ML + part * 2)
    l = tl.load(SEG_ML + part * 2 + 1)
    w = tl.exp2((m - tl.max(m, 0)) * _LOG2E)
    acc = tl.load(SEG_ACC + part[:, None] * HEAD_PAD + d[None, :])
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(OUT + t * stride_o_t + h * stride_o_h + d * stride_o_d,
             out.to(OUT.dtype.element_ty), mask=d < HEAD)


if HAS_TRITON:
    _ATTENTION = TritonKernel(_unified_attention_kernel)
    _COMBINE = TritonKernel(_combine_segments_kernel)


@dataclass(frozen=True)
class AttentionLaunch:
    """Tile sizes and split of one launch, chosen from shapes only."""
    block_m: int
    """Rows of a program's tile: block_q tokens x the padded query heads of a KV head."""
    block_q: int
    tile: int
    """Key positions per inner-loop step."""
    num_segments: int
    """Ranges the keys of each query block are split into (1: no split)."""
    num_warps: int
    num_stages: int

    def num_q_blocks(self, num_tokens: int, num_seqs: int) -> int:
        return num_tokens // self.block_q + num_seqs


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_launch(num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int,
                head_size: int, max_blocks: int, block_size: int, dtype: torch.dtype,
                device: torch.device) -> AttentionLaunch:
    """Tiles for a step's shapes. Batches averaging a few query rows per sequence
    (decodes) take the smallest row tile `tl.dot` allows and 16-key tiles; prefills
    take 128 rows (64 for head_size 256) and 32-key tiles. Larger key tiles make
    sm_90 spill registers (the gathered K/V addresses are per element), and so do
    float32 queries (exact float32 dots) beyond the decode tiles. Too few programs
    for the GPU's SMs (about 4 per SM wanted) split the keys."""
    qpk_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    head_pad = max(16, triton.next_power_of_2(head_size))  # tl.dot: K >= 16
    decode_like = num_tokens <= 4 * num_seqs or dtype == torch.float32
    if decode_like:
        block_m, tile, warps, stages = 16, 16, 4, 2
    else:
        block_m, tile, warps = (128, 32, 8) if head_pad <= 128 else (64, 32, 8)
        stages = 3 if head_pad <= 128 else 2
    block_m = max(block_m, qpk_pad)
    segments = 1
    programs = (num_tokens // (block_m // qpk_pad) + num_seqs) * num_kv_heads
    sms = _num_sms(device)
    max_tiles = math.ceil(max_blocks * block_size / tile)
    if programs < sms and max_tiles >= 8:
        want = min(math.ceil(4 * sms / programs), max_tiles // 4, _MAX_SEGMENTS)
        segments = 1 << (max(want, 1).bit_length() - 1)
    return AttentionLaunch(block_m, block_m // qpk_pad, tile, segments, warps, stages)


def unified_attention(query: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                      query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                      block_table: torch.Tensor, block_size: int, scale: float,
                      sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None,
                      alibi_slopes: Optional[torch.Tensor] = None,
                      k_scale: float = 1.0, v_scale: float = 1.0,
                      sinks: Optional[torch.Tensor] = None) -> None:
    """Paged causal attention of `query` `[T, num_heads, head_size]` into `out` (in
    place) for every sequence of the step; see the module docstring. `sinks`
    [num_heads] float32: one more logit per head in each softmax denominator."""
    require_triton("unified_attention")
    num_tokens, num_heads, head_size = query.shape
    launch = plan_launch(num_tokens, query_start_loc.shape[0] - 1, num_heads,
                         kv_cache.shape[1], head_size, block_table.shape[1],
                         block_size, query.dtype, query.device)
    run_unified_attention(query, kv_cache, out, query_start_loc, seq_lens, block_table,
                          block_size, scale, launch, sliding_window, softcap,
                          alibi_slopes, k_scale, v_scale, sinks)


def _check_shapes(query: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                  alibi_slopes: Optional[torch.Tensor]) -> None:
    num_heads, head_size = query.shape[1], query.shape[2]
    if out.shape != query.shape:
        raise ValueError(f"out {tuple(out.shape)} != query {tuple(query.shape)}")
    if kv_cache.dim() != 4 or kv_cache.shape[0] != 2 or kv_cache.shape[3] != head_size:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} is not "
                         f"[2, num_kv_heads, slots, {head_size}]")
    if num_heads % kv_cache.shape[1]:
        raise ValueError(f"{num_heads} query heads are not a multiple of "
                         f"{kv_cache.shape[1]} KV heads")
    if alibi_slopes is not None and alibi_slopes.shape != (num_heads,):
        raise ValueError(f"alibi_slopes {tuple(alibi_slopes.shape)} != ({num_heads},)")


def run_unified_attention(query: torch.Tensor, kv_cache: torch.Tensor,
                          out: torch.Tensor, query_start_loc: torch.Tensor,
                          seq_lens: torch.Tensor, block_table: torch.Tensor,
                          block_size: int, scale: float, launch: AttentionLaunch,
                          sliding_window: Optional[int] = None,
                          softcap: Optional[float] = None,
                          alibi_slopes: Optional[torch.Tensor] = None,
                          k_scale: float = 1.0, v_scale: float = 1.0,
                          sinks: Optional[torch.Tensor] = None) -> None:
    """`unified_attention` with explicit tiles (tests force the split-KV path)."""
    require_triton("unified_attention")
    _check_shapes(query, kv_cache, out, alibi_slopes)
    if sinks is not None:
        if sinks.shape != (query.shape[1],):
            raise ValueError(f"sinks {tuple(sinks.shape)} != ({query.shape[1]},)")
        sinks = sinks.float().contiguous()
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = kv_cache.shape[1]
    num_seqs = query_start_loc.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return
    head_pad = max(16, triton.next_power_of_2(head_size))  # tl.dot: K >= 16
    qpk = num_heads // num_kv_heads
    segments = launch.num_segments
    if segments > 1:
        seg_acc = torch.empty(num_tokens, num_heads, segments, head_pad,
                              dtype=torch.float32, device=query.device)
        seg_ml = torch.empty(num_tokens, num_heads, segments, 2, dtype=torch.float32,
                             device=query.device)
    else:
        seg_acc = seg_ml = out  # not read: the kernel writes `out` directly
    slopes = alibi_slopes if alibi_slopes is not None else query
    sink_arg = sinks if sinks is not None else query
    # Triton's interpreter multiplies bfloat16 tiles as their raw uint16 bits: on CPU
    # the dot products take bfloat16 operands in float32 instead.
    interpret = query.device.type == "cpu"
    grid = (launch.num_q_blocks(num_tokens, num_seqs), num_kv_heads, segments)
    _ATTENTION.on(query.device)[grid](
        query, kv_cache, out, query_start_loc, seq_lens, block_table, slopes, sink_arg,
        seg_acc, seg_ml,
        float(scale * k_scale), float(softcap or 0.0), float(v_scale),
        int(sliding_window or 0), num_seqs,
        *query.stride(), *out.stride(), *kv_cache.stride(), block_table.stride(0),
        NUM_HEADS=num_heads, QPK=qpk, QPK_PAD=triton.next_power_of_2(qpk),
        BLOCK_Q=launch.block_q, BLOCK_M=launch.block_m,
        HEAD=head_size, HEAD_PAD=head_pad, BLOCK_SIZE=block_size, TILE=launch.tile,
        USE_WINDOW=bool(sliding_window), USE_SOFTCAP=bool(softcap),
        USE_ALIBI=alibi_slopes is not None, USE_SINKS=sinks is not None,
        NUM_SEGMENTS=segments,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 or interpret else "tf32",
        DOT_FP32=interpret and query.dtype == torch.bfloat16,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    if segments > 1:
        _COMBINE.on(query.device)[(num_tokens, num_heads)](
            out, seg_acc, seg_ml, query_start_loc, num_seqs, *out.stride(),
            NUM_HEADS=num_heads, NUM_SEGMENTS=segments, HEAD=head_size,
            HEAD_PAD=head_pad, num_warps=4 if head_pad >= 128 else 2,
        )
