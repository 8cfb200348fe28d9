"""Triton kernels of the state-space and linear-attention layers on CUDA: the causal
conv1d (prefill over padded sequences, and the one-token step), the Mamba2 SSD step,
Mamba1's selective-scan step and the gated delta rule step (Gated DeltaNet); the
prefill scans (Mamba1's `selective_scan`, Mamba2's `ssd_chunk_scan`, Gated DeltaNet's
`gated_delta_rule_chunked`) and Mamba2's `gated_rms_norm`.

Each is a drop-in for the torch op of the same name in
vllm/model_executor/layers/mamba/ops.py (same arguments, same layouts, same result
dtypes), bound in the kernel table (vllm/model_executor/kernels.py) by the CUDA
platform. A decode step of a hybrid model ran each of these as a handful of torch
kernels per layer (cat, multiply, sum, exp, addcmul, bmm, ...); here each is one.

The step kernels also take the ops' `state_slots`: `state` is then the whole slot
cache `[num_slots, ...]`, each request's row `state_slots[i]` is read and updated in
place (in the cache's dtype), and no gathered copy of the states is made. A program
owns the rows it writes; it reads every value it needs before the barrier that
precedes its stores, so updating in place is safe.

The recurrences, from the papers (Mamba: Gu & Dao 2023; Mamba2/SSD: Dao & Gu 2024;
Gated DeltaNet: Yang et al. 2024), with dt already softplus'ed by the caller:
- SSD step, per head h (group g of B, C): S = exp(dt A) S + dt x B^T; y = S C + D x;
- selective step, per channel d: h = exp(dt A_d) h + dt x B; y = h.C + D x;
- gated delta rule: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
Arithmetic is float32; the conv rounds where the torch op does (products and sum in
the activation dtype), so float32 results equal the torch ops to rounding.

The prefill scans run the same recurrences token by token over each padded sequence,
one program per (sequence, channel block) or (sequence, head, block of the state's
rows or columns) with its state tile in registers, reading the initial state once and
writing the final one once: no chunking, so their `chunk_size` is unused (the chunked
torch ops compute the same result, to rounding). Padding tokens (dt = 0; g = beta = 0)
leave the state alone, as in the torch ops. Parallelism is batch x heads x blocks and
the time loop is sequential: simple, and fine for the short prompts of a step; long
prompts would gain from a chunked (matrix-multiply) form.

Compiled per device by `TritonKernel` (vllm/attention/ops/triton_reshape_and_cache.py):
`triton.jit` for CUDA tensors, the interpreter for CPU tensors (the tests). No helper
functions, for the reason given there.
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm.attention.ops.triton_reshape_and_cache import (HAS_TRITON, TritonKernel,
                                                         require_triton, tl, triton)


def _conv1d_kernel(
    X, W, BIAS, STATE, LENGTHS, OUT, NEW_STATE,
    sx_b, sx_t, sx_c, sw_c, sw_k, ss_b, ss_c, ss_k, so_b, so_t, so_c,
    sn_b, sn_c, sn_k,
    seq_len, channels,
    WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LENGTHS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (sequence, block of positions, block of channels): OUT = silu(conv)
    over the inputs [state | x]; the position-block-0 programs also write the new
    state, the K - 1 inputs before the sequence's end (its length)."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_ok = t < seq_len
    c_ok = c < channels
    hist = WIDTH - 1
    xdt = X.dtype.element_ty
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(WIDTH):
        # input j of output t's window: [state | x] index t + j, x index t + j - hist
        pos = t + j - hist
        in_x = pos >= 0
        xv = tl.load(X + row * sx_b + pos[:, None] * sx_t + c[None, :] * sx_c,
                     mask=(in_x & t_ok)[:, None] & c_ok[None, :], other=0.0)
        sv = tl.load(STATE + row * ss_b + c[None, :] * ss_c + (t + j)[:, None] * ss_k,
                     mask=((~in_x) & t_ok)[:, None] & c_ok[None, :], other=0.0)
        val = tl.where(in_x[:, None], xv.to(tl.float32), sv.to(xdt).to(tl.float32))
        w = tl.load(W + c * sw_c + j * sw_k, mask=c_ok, other=0.0).to(xdt).to(tl.float32)
        acc += val * w[None, :]
    if HAS_BIAS:  # inside the conv, as F.conv1d: one rounding of the sum
        acc += tl.load(BIAS + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    acc = acc.to(OUT.dtype.element_ty).to(tl.float32)
    out = acc / (1.0 + tl.exp(-acc))
    tl.store(OUT + row * so_b + t[:, None] * so_t + c[None, :] * so_c,
             out.to(OUT.dtype.element_ty), mask=t_ok[:, None] & c_ok[None, :])
    if tl.program_id(1) == 0:
        if HAS_LENGTHS:
            length = tl.load(LENGTHS + row).to(tl.int32)
        else:
            length = seq_len
        i = tl.arange(0, BLOCK_K)
        i_ok = i < hist
        src = length + i  # index into [state | x]
        from_x = src >= hist
        xs = tl.load(X + row * sx_b + (src - hist)[:, None] * sx_t + c[None, :] * sx_c,
                     mask=(from_x & i_ok)[:, None] & c_ok[None, :], other=0.0)
        ss = tl.load(STATE + row * ss_b + c[None, :] * ss_c + src[:, None] * ss_k,
                     mask=((~from_x) & i_ok)[:, None] & c_ok[None, :], other=0.0)
        new = tl.where(from_x[:, None], xs, ss.to(xdt))
        tl.store(NEW_STATE + row * sn_b + c[None, :] * sn_c + i[:, None] * sn_k,
                 new.to(NEW_STATE.dtype.element_ty), mask=i_ok[:, None] & c_ok[None, :])


def _conv1d_step_kernel(
    X, W, BIAS, STATE, SLOTS, NEW_STATE, OUT,
    sx_b, sx_c, sw_c, sw_k, ss_b, ss_c, ss_k, sn_b, sn_c, sn_k, so_b,
    channels,
    WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SLOTS: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (request, block of channels): window [state | x], OUT = silu(window .
    weight (+ bias)); the state shifts by one input (x enters last)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    j = tl.arange(0, BLOCK_K)
    c_ok = c < channels
    hist = WIDTH - 1
    xdt = X.dtype.element_ty
    if HAS_SLOTS:
        src = tl.load(SLOTS + row).to(tl.int64)
    else:
        src = row
    x = tl.load(X + row * sx_b + c * sx_c, mask=c_ok, other=0.0)
    base = STATE + src * ss_b + c[:, None] * ss_c
    old = tl.load(base + j[None, :] * ss_k, mask=c_ok[:, None] & (j[None, :] < hist),
                  other=0.0)
    nxt = tl.load(base + (j[None, :] + 1) * ss_k,
                  mask=c_ok[:, None] & (j[None, :] + 1 < hist), other=0.0)
    window = tl.where(j[None, :] == hist, x.to(tl.float32)[:, None],
                      old.to(xdt).to(tl.float32))
    w = tl.load(W + c[:, None] * sw_c + j[None, :] * sw_k,
                mask=c_ok[:, None] & (j[None, :] < WIDTH), other=0.0)
    prod = (window * w.to(xdt).to(tl.float32)).to(xdt).to(tl.float32)
    acc = tl.sum(prod, 1).to(xdt).to(tl.float32)
    if HAS_BIAS:
        acc = (acc + tl.load(BIAS + c, mask=c_ok, other=0.0).to(tl.float32))
        acc = acc.to(OUT.dtype.element_ty).to(tl.float32)
    new = tl.where(j[None, :] == hist - 1, x[:, None], nxt.to(xdt))
    tl.debug_barrier()  # every read of the old state precedes the stores (in place)
    if HAS_SLOTS:
        dst = src
    else:
        dst = row
    tl.store(NEW_STATE + dst * sn_b + c[:, None] * sn_c + j[None, :] * sn_k,
             new.to(NEW_STATE.dtype.element_ty), mask=c_ok[:, None] & (j[None, :] < hist))
    tl.store(OUT + row * so_b + c, (acc / (1.0 + tl.exp(-acc))).to(OUT.dtype.element_ty),
             mask=c_ok)


def _ssd_step_kernel(
    X, DT, A, B, C, D, STATE, SLOTS, NEW_STATE, Y,
    sx_b, sx_h, sx_p, sdt_b, sdt_h, sb_b, sb_g, sb_n, sc_b, sc_g, sc_n,
    ss_b, ss_h, ss_p, ss_n, sn_b, sn_h, sn_p, sn_n, sy_b, sy_h,
    head_dim, state_size, heads_per_group,
    HAS_SLOTS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (request, head, block of head channels): S = exp(dt A) S + (dt x) B^T,
    y = S C + D x."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    p_ok = p < head_dim
    n_ok = n < state_size
    ok = p_ok[:, None] & n_ok[None, :]
    g = h // heads_per_group
    if HAS_SLOTS:
        src = tl.load(SLOTS + row).to(tl.int64)
    else:
        src = row
    x = tl.load(X + row * sx_b + h * sx_h + p * sx_p, mask=p_ok, other=0.0).to(tl.float32)
    dt = tl.load(DT + row * sdt_b + h * sdt_h).to(tl.float32)
    decay = tl.exp(dt * tl.load(A + h).to(tl.float32))
    bv = tl.load(B + row * sb_b + g * sb_g + n * sb_n, mask=n_ok, other=0.0).to(tl.float32)
    cv = tl.load(C + row * sc_b + g * sc_g + n * sc_n, mask=n_ok, other=0.0).to(tl.float32)
    d = tl.load(D + h).to(tl.float32)
    state = tl.load(STATE + src * ss_b + h * ss_h + p[:, None] * ss_p + n[None, :] * ss_n,
                    mask=ok, other=0.0).to(tl.float32)
    state = state * decay + (dt * x)[:, None] * bv[None, :]
    y = tl.sum(state * cv[None, :], 1) + x * d
    tl.debug_barrier()
    if HAS_SLOTS:
        dst = src
    else:
        dst = row
    tl.store(NEW_STATE + dst * sn_b + h * sn_h + p[:, None] * sn_p + n[None, :] * sn_n,
             state.to(NEW_STATE.dtype.element_ty), mask=ok)
    tl.store(Y + row * sy_b + h * sy_h + p, y, mask=p_ok)


def _selective_step_kernel(
    X, DT, A, B, C, D, STATE, SLOTS, NEW_STATE, Y,
    sx_b, sdt_b, sa_d, sa_n, sb_b, sc_b, ss_b, ss_d, ss_n, sn_b, sn_d, sn_n, sy_b,
    channels, state_size,
    HAS_SLOTS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (request, block of channels): h = exp(dt A) h + (dt x) B, y = h.C + D x
    (x, dt of unit channel stride, B, C of unit state stride)."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok = d < channels
    n_ok = n < state_size
    ok = d_ok[:, None] & n_ok[None, :]
    if HAS_SLOTS:
        src = tl.load(SLOTS + row).to(tl.int64)
    else:
        src = row
    x = tl.load(X + row * sx_b + d, mask=d_ok, other=0.0).to(tl.float32)
    dt = tl.load(DT + row * sdt_b + d, mask=d_ok, other=0.0).to(tl.float32)
    a = tl.load(A + d[:, None] * sa_d + n[None, :] * sa_n, mask=ok, other=0.0).to(tl.float32)
    bv = tl.load(B + row * sb_b + n, mask=n_ok, other=0.0).to(tl.float32)
    cv = tl.load(C + row * sc_b + n, mask=n_ok, other=0.0).to(tl.float32)
    dskip = tl.load(D + d, mask=d_ok, other=0.0).to(tl.float32)
    state = tl.load(STATE + src * ss_b + d[:, None] * ss_d + n[None, :] * ss_n,
                    mask=ok, other=0.0).to(tl.float32)
    state = state * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * bv[None, :]
    y = tl.sum(state * cv[None, :], 1) + x * dskip
    tl.debug_barrier()
    if HAS_SLOTS:
        dst = src
    else:
        dst = row
    tl.store(NEW_STATE + dst * sn_b + d[:, None] * sn_d + n[None, :] * sn_n,
             state.to(NEW_STATE.dtype.element_ty), mask=ok)
    tl.store(Y + row * sy_b + d, y, mask=d_ok)


def _gated_delta_step_kernel(
    Q, K, V, G, BETA, STATE, SLOTS, NEW_STATE, O,
    sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sbeta_b, sbeta_h,
    ss_b, ss_h, ss_k, ss_v, sn_b, sn_h, sn_k, sn_v, so_b, so_h,
    dk, dv,
    HAS_SLOTS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Program (request, head, block of value columns): S = exp(g) S; S += k (beta (v -
    S^T k))^T; o = S^T q. Each value column of S evolves on its own (q, k, v of unit
    last stride)."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    col = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    i = tl.arange(0, BLOCK_K)
    col_ok = col < dv
    i_ok = i < dk
    ok = i_ok[:, None] & col_ok[None, :]
    if HAS_SLOTS:
        src = tl.load(SLOTS + row).to(tl.int64)
    else:
        src = row
    q = tl.load(Q + row * sq_b + h * sq_h + i, mask=i_ok, other=0.0).to(tl.float32)
    k = tl.load(K + row * sk_b + h * sk_h + i, mask=i_ok, other=0.0).to(tl.float32)
    v = tl.load(V + row * sv_b + h * sv_h + col, mask=col_ok, other=0.0).to(tl.float32)
    g = tl.load(G + row * sg_b + h * sg_h).to(tl.float32)
    beta = tl.load(BETA + row * sbeta_b + h * sbeta_h).to(tl.float32)
    state = tl.load(STATE + src * ss_b + h * ss_h + i[:, None] * ss_k + col[None, :] * ss_v,
                    mask=ok, other=0.0).to(tl.float32)
    state = state * tl.exp(g)
    delta = (v - tl.sum(state * k[:, None], 0)) * beta
    state = state + k[:, None] * delta[None, :]
    o = tl.sum(state * q[:, None], 0)
    tl.debug_barrier()
    if HAS_SLOTS:
        dst = src
    else:
        dst = row
    tl.store(NEW_STATE + dst * sn_b + h * sn_h + i[:, None] * sn_k + col[None, :] * sn_v,
             state.to(NEW_STATE.dtype.element_ty), mask=ok)
    tl.store(O + row * so_b + h * so_h + col, o, mask=col_ok)


def _selective_scan_kernel(
    X, DT, A, B, C, D, STATE, Y, NEW_STATE,
    sx_b, sx_t, sx_d, sdt_b, sdt_t, sdt_d, sa_d, sa_n, sb_b, sb_t, sb_n,
    sc_b, sc_t, sc_n, sd_d, ss_b, ss_d, ss_n, sy_b, sy_t, sn_b, sn_d, sn_n,
    seq_len, channels, state_size,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (sequence, block of channels), token by token with the state in
    registers: h = exp(dt A) h + (dt x) B, y = h.C + D x (dt = 0: h unchanged)."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok = d < channels
    n_ok = n < state_size
    ok = d_ok[:, None] & n_ok[None, :]
    a = tl.load(A + d[:, None] * sa_d + n[None, :] * sa_n, mask=ok, other=0.0).to(tl.float32)
    dskip = tl.load(D + d * sd_d, mask=d_ok, other=0.0).to(tl.float32)
    state = tl.load(STATE + row * ss_b + d[:, None] * ss_d + n[None, :] * ss_n,
                    mask=ok, other=0.0).to(tl.float32)
    for t in range(0, seq_len):
        x = tl.load(X + row * sx_b + t * sx_t + d * sx_d, mask=d_ok, other=0.0).to(tl.float32)
        dt = tl.load(DT + row * sdt_b + t * sdt_t + d * sdt_d, mask=d_ok,
                     other=0.0).to(tl.float32)
        bv = tl.load(B + row * sb_b + t * sb_t + n * sb_n, mask=n_ok, other=0.0).to(tl.float32)
        cv = tl.load(C + row * sc_b + t * sc_t + n * sc_n, mask=n_ok, other=0.0).to(tl.float32)
        state = state * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * bv[None, :]
        y = tl.sum(state * cv[None, :], 1) + x * dskip
        tl.store(Y + row * sy_b + t * sy_t + d, y, mask=d_ok)
    tl.store(NEW_STATE + row * sn_b + d[:, None] * sn_d + n[None, :] * sn_n, state, mask=ok)


def _ssd_scan_kernel(
    X, DT, A, B, C, D, STATE, Y, NEW_STATE,
    sx_b, sx_t, sx_h, sx_p, sdt_b, sdt_t, sdt_h, sb_b, sb_t, sb_g, sb_n,
    sc_b, sc_t, sc_g, sc_n, ss_b, ss_h, ss_p, ss_n, sy_b, sy_t, sy_h,
    sn_b, sn_h, sn_p, sn_n,
    seq_len, head_dim, state_size, heads_per_group,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (sequence, head, block of head channels), token by token with the state
    tile in registers: S = exp(dt A) S + (dt x) B^T, y = S C + D x (the SSD scan's
    recurrent form; dt = 0 leaves S unchanged)."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    p_ok = p < head_dim
    n_ok = n < state_size
    ok = p_ok[:, None] & n_ok[None, :]
    g = h // heads_per_group
    a = tl.load(A + h).to(tl.float32)
    dskip = tl.load(D + h).to(tl.float32)
    state = tl.load(STATE + row * ss_b + h * ss_h + p[:, None] * ss_p + n[None, :] * ss_n,
                    mask=ok, other=0.0).to(tl.float32)
    for t in range(0, seq_len):
        x = tl.load(X + row * sx_b + t * sx_t + h * sx_h + p * sx_p, mask=p_ok,
                    other=0.0).to(tl.float32)
        dt = tl.load(DT + row * sdt_b + t * sdt_t + h * sdt_h).to(tl.float32)
        bv = tl.load(B + row * sb_b + t * sb_t + g * sb_g + n * sb_n, mask=n_ok,
                     other=0.0).to(tl.float32)
        cv = tl.load(C + row * sc_b + t * sc_t + g * sc_g + n * sc_n, mask=n_ok,
                     other=0.0).to(tl.float32)
        state = state * tl.exp(dt * a) + (dt * x)[:, None] * bv[None, :]
        y = tl.sum(state * cv[None, :], 1) + x * dskip
        tl.store(Y + row * sy_b + t * sy_t + h * sy_h + p, y, mask=p_ok)
    tl.store(NEW_STATE + row * sn_b + h * sn_h + p[:, None] * sn_p + n[None, :] * sn_n,
             state, mask=ok)


def _gated_delta_scan_kernel(
    Q, K, V, G, BETA, STATE, O, NEW_STATE,
    sq_b, sq_t, sq_h, sq_k, sk_b, sk_t, sk_h, sk_k, sv_b, sv_t, sv_h, sv_v,
    sg_b, sg_t, sg_h, sbeta_b, sbeta_t, sbeta_h, ss_b, ss_h, ss_k, ss_v,
    so_b, so_t, so_h, sn_b, sn_h, sn_k, sn_v,
    seq_len, dk, dv,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Program (sequence, head, block of value columns), token by token with the state
    tile [dk, block of dv] in registers: S = exp(g) S; S += k (beta (v - S^T k))^T;
    o = S^T q (g = beta = 0 leaves S unchanged). Each value column evolves on its own."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    col = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    i = tl.arange(0, BLOCK_K)
    col_ok = col < dv
    i_ok = i < dk
    ok = i_ok[:, None] & col_ok[None, :]
    state = tl.load(STATE + row * ss_b + h * ss_h + i[:, None] * ss_k + col[None, :] * ss_v,
                    mask=ok, other=0.0).to(tl.float32)
    for t in range(0, seq_len):
        q = tl.load(Q + row * sq_b + t * sq_t + h * sq_h + i * sq_k, mask=i_ok,
                    other=0.0).to(tl.float32)
        k = tl.load(K + row * sk_b + t * sk_t + h * sk_h + i * sk_k, mask=i_ok,
                    other=0.0).to(tl.float32)
        v = tl.load(V + row * sv_b + t * sv_t + h * sv_h + col * sv_v, mask=col_ok,
                    other=0.0).to(tl.float32)
        g = tl.load(G + row * sg_b + t * sg_t + h * sg_h).to(tl.float32)
        beta = tl.load(BETA + row * sbeta_b + t * sbeta_t + h * sbeta_h).to(tl.float32)
        state = state * tl.exp(g)
        delta = (v - tl.sum(state * k[:, None], 0)) * beta
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], 0)
        tl.store(O + row * so_b + t * so_t + h * so_h + col, o, mask=col_ok)
    tl.store(NEW_STATE + row * sn_b + h * sn_h + i[:, None] * sn_k + col[None, :] * sn_v,
             state, mask=ok)


def _gated_rms_norm_kernel(
    X, GATE, W, OUT,
    sx_r, sg_r, so_r, group_size,
    eps,
    HAS_GATE: tl.constexpr, GATE_AFTER: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program (row, group of channels), two passes over the group: the sum of squares
    of h = x (* silu(gate)), then weight * h / rms (rounded to x's dtype first, as the
    torch op), or with GATE_AFTER weight * h / rms * silu(gate). Rows of unit channel
    stride."""
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1).to(tl.int64) * group_size
    offs = tl.arange(0, BLOCK)
    xdt = X.dtype.element_ty
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for base in range(0, group_size, BLOCK):
        c = start + base + offs
        ok = base + offs < group_size
        hv = tl.load(X + row * sx_r + c, mask=ok, other=0.0).to(tl.float32)
        if HAS_GATE:
            if not GATE_AFTER:
                gv = tl.load(GATE + row * sg_r + c, mask=ok, other=0.0).to(tl.float32)
                hv = hv * (gv / (1.0 + tl.exp(-gv)))
        acc += hv * hv
    inv = tl.rsqrt(tl.sum(acc, 0) / group_size + eps)
    for base in range(0, group_size, BLOCK):
        c = start + base + offs
        ok = base + offs < group_size
        hv = tl.load(X + row * sx_r + c, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(W + c, mask=ok, other=0.0).to(tl.float32)
        if HAS_GATE:
            gv = tl.load(GATE + row * sg_r + c, mask=ok, other=0.0).to(tl.float32)
            sg = gv / (1.0 + tl.exp(-gv))
            if GATE_AFTER:
                out = w * (hv * inv) * sg
            else:
                out = w * (hv * sg * inv).to(xdt).to(tl.float32)
        else:
            out = w * (hv * inv).to(xdt).to(tl.float32)
        tl.store(OUT + row * so_r + c, out.to(OUT.dtype.element_ty), mask=ok)


if HAS_TRITON:
    _CONV1D = TritonKernel(_conv1d_kernel)
    _CONV1D_STEP = TritonKernel(_conv1d_step_kernel)
    _SSD_STEP = TritonKernel(_ssd_step_kernel)
    _SELECTIVE_STEP = TritonKernel(_selective_step_kernel)
    _GATED_DELTA_STEP = TritonKernel(_gated_delta_step_kernel)
    _SELECTIVE_SCAN = TritonKernel(_selective_scan_kernel)
    _SSD_SCAN = TritonKernel(_ssd_scan_kernel)
    _GATED_DELTA_SCAN = TritonKernel(_gated_delta_scan_kernel)
    _GATED_RMS_NORM = TritonKernel(_gated_rms_norm_kernel)


def _pow2(n: int, least: int = 1) -> int:
    return max(least, triton.next_power_of_2(max(1, n)))


def _slots_and_out(state: torch.Tensor, state_slots: Optional[torch.Tensor],
                   shape: tuple[int, ...], dtype: torch.dtype):
    """(the slots tensor to pass, the tensor new states are written to): the cache
    itself with slots, else a new tensor."""
    if state_slots is not None:
        return state_slots, state
    return state, torch.empty(shape, dtype=dtype, device=state.device)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  conv_state: torch.Tensor, lengths: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.causal_conv1d: x [b, T, C], weight [C, K], conv_state [b, C, K - 1],
    lengths [b] (default T) -> (silu(conv) [b, T, C], new conv state [b, C, K - 1])."""
    require_triton("causal_conv1d")
    b, t, c = x.shape
    k = weight.shape[-1]
    out_dtype = x.dtype if bias is None else torch.result_type(x, bias)
    out = torch.empty(b, t, c, dtype=out_dtype, device=x.device)
    new_state = torch.empty(b, c, k - 1, dtype=x.dtype, device=x.device)
    if b == 0 or c == 0:
        return out, new_state
    block_c = min(64, _pow2(c, 16))
    block_t = min(32, _pow2(t, 16))
    _CONV1D.on(x.device)[(b, triton.cdiv(max(t, 1), block_t), triton.cdiv(c, block_c))](
        x, weight, bias if bias is not None else weight, conv_state,
        lengths if lengths is not None else weight, out, new_state,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), weight.stride(-1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), t, c,
        WIDTH=k, HAS_BIAS=bias is not None, HAS_LENGTHS=lengths is not None,
        BLOCK_T=block_t, BLOCK_C=block_c, BLOCK_K=_pow2(k - 1, 2), num_warps=4)
    return out, new_state


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       conv_state: torch.Tensor, state_slots: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.causal_conv1d_step: x [b, C] -> (silu(conv) [b, C], new conv state)."""
    require_triton("causal_conv1d_step")
    b, c = x.shape
    k = weight.shape[-1]
    out = torch.empty(b, c, dtype=x.dtype if bias is None else torch.result_type(x, bias),
                      device=x.device)
    slots, new_state = _slots_and_out(conv_state, state_slots, (b, c, k - 1), x.dtype)
    if b == 0 or c == 0:
        return out, new_state
    block_c = min(128, _pow2(c, 16))
    _CONV1D_STEP.on(x.device)[(b, triton.cdiv(c, block_c))](
        x, weight, bias if bias is not None else weight, conv_state, slots, new_state, out,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(-1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), out.stride(0), c,
        WIDTH=k, HAS_BIAS=bias is not None, HAS_SLOTS=state_slots is not None,
        BLOCK_C=block_c, BLOCK_K=_pow2(k, 2), num_warps=4)
    return out, new_state


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
             state_slots: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.ssd_step: x [b, H, P], dt [b, H], A, D [H], B, C [b, G, N], state
    [b, H, P, N] -> (y [b, H, P], new state), float32."""
    require_triton("ssd_step")
    b, h, p = x.shape
    groups, n = B.shape[-2:]
    y = torch.empty(b, h, p, dtype=torch.float32, device=x.device)
    slots, new_state = _slots_and_out(state, state_slots, (b, h, p, n), torch.float32)
    if b == 0 or h == 0 or p == 0:
        return y, new_state
    A, D = A.contiguous(), D.contiguous()
    block_n = _pow2(n, 16)
    block_p = min(_pow2(p, 16), max(16, 8192 // block_n))
    _SSD_STEP.on(x.device)[(b, h, triton.cdiv(p, block_p))](
        x, dt, A, B, C, D, state, slots, new_state, y,
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        state.stride(0), state.stride(1), state.stride(2), state.stride(3),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), new_state.stride(3),
        y.stride(0), y.stride(1), p, n, h // groups,
        HAS_SLOTS=state_slots is not None, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4)
    return y, new_state


def selective_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                   state_slots: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.selective_step: x, dt [b, d], A [d, n], B, C [b, n], D [d], state [b, d, n]
    -> (y [b, d], new state), float32."""
    require_triton("selective_step")
    b, d = x.shape
    n = A.shape[-1]
    x, dt, B, C, D = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, dt, B, C, D))
    y = torch.empty(b, d, dtype=torch.float32, device=x.device)
    slots, new_state = _slots_and_out(state, state_slots, (b, d, n), torch.float32)
    if b == 0 or d == 0:
        return y, new_state
    block_n = _pow2(n, 16)
    block_d = min(_pow2(d, 16), max(16, 4096 // block_n))
    _SELECTIVE_STEP.on(x.device)[(b, triton.cdiv(d, block_d))](
        x, dt, A, B, C, D, state, slots, new_state, y,
        x.stride(0), dt.stride(0), A.stride(0), A.stride(1), B.stride(0), C.stride(0),
        state.stride(0), state.stride(1), state.stride(2),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), y.stride(0), d, n,
        HAS_SLOTS=state_slots is not None, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=4)
    return y, new_state


def gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                          state_slots: Optional[torch.Tensor] = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.gated_delta_rule_step: q, k [b, H, dk], v [b, H, dv], g, beta [b, H], state
    [b, H, dk, dv] -> (o [b, H, dv], new state), float32."""
    require_triton("gated_delta_rule_step")
    b, h, dk = q.shape
    dv = v.shape[-1]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = torch.empty(b, h, dv, dtype=torch.float32, device=q.device)
    slots, new_state = _slots_and_out(state, state_slots, (b, h, dk, dv), torch.float32)
    if b == 0 or h == 0 or dv == 0:
        return o, new_state
    block_k = _pow2(dk, 16)
    block_v = min(_pow2(dv, 16), max(16, 4096 // block_k))
    _GATED_DELTA_STEP.on(q.device)[(b, h, triton.cdiv(dv, block_v))](
        q, k, v, g, beta, state, slots, new_state, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        state.stride(0), state.stride(1), state.stride(2), state.stride(3),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), new_state.stride(3),
        o.stride(0), o.stride(1), dk, dv,
        HAS_SLOTS=state_slots is not None, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=4)
    return o, new_state


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, state: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.selective_scan: x, dt [b, T, d] (dt 0 at padding), A [d, n], B, C [b, T, n],
    D [d], state [b, d, n] -> (y [b, T, d], final state [b, d, n]), float32."""
    require_triton("selective_scan")
    b, t, d = x.shape
    n = A.shape[-1]
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty(b, t, d, dtype=torch.float32, device=x.device)
    new_state = torch.empty(b, d, n, dtype=torch.float32, device=x.device)
    if b == 0 or d == 0:
        return y, new_state
    block_n = _pow2(n, 16)
    block_d = min(_pow2(d, 16), max(16, 1024 // block_n))
    _SELECTIVE_SCAN.on(x.device)[(b, triton.cdiv(d, block_d))](
        x, dt, A, B, C, D, state, y, new_state,
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1), dt.stride(2),
        A.stride(0), A.stride(1), B.stride(0), B.stride(1), B.stride(2),
        C.stride(0), C.stride(1), C.stride(2), D.stride(0),
        state.stride(0), state.stride(1), state.stride(2), y.stride(0), y.stride(1),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), t, d, n,
        BLOCK_D=block_d, BLOCK_N=block_n, num_warps=2 if block_d * block_n <= 1024 else 4)
    return y, new_state


def ssd_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, chunk_size: int,
                   initial_state: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.ssd_chunk_scan: x [b, T, H, P], dt [b, T, H] (0 at padding), A, D [H],
    B, C [b, T, G, N], initial_state [b, H, P, N] -> (y [b, T, H, P], final state),
    float32. Computed by the recurrence token by token (the chunked form's result, to
    rounding), so `chunk_size` does not matter here."""
    require_triton("ssd_chunk_scan")
    b, t, h, p = x.shape
    groups, n = B.shape[-2:]
    y = torch.empty(b, t, h, p, dtype=torch.float32, device=x.device)
    new_state = torch.empty(b, h, p, n, dtype=torch.float32, device=x.device)
    if b == 0 or h == 0 or p == 0:
        return y, new_state
    x = x if x.stride(-1) == 1 else x.contiguous()
    A, D = A.contiguous(), D.contiguous()
    s0 = initial_state
    block_n = _pow2(n, 16)
    block_p = min(_pow2(p, 16), max(16, 2048 // block_n))
    _SSD_SCAN.on(x.device)[(b, h, triton.cdiv(p, block_p))](
        x, dt, A, B, C, D, s0, y, new_state,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        dt.stride(0), dt.stride(1), dt.stride(2),
        B.stride(0), B.stride(1), B.stride(2), B.stride(3),
        C.stride(0), C.stride(1), C.stride(2), C.stride(3),
        s0.stride(0), s0.stride(1), s0.stride(2), s0.stride(3),
        y.stride(0), y.stride(1), y.stride(2),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), new_state.stride(3),
        t, p, n, h // groups,
        BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4)
    return y, new_state


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                             chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.gated_delta_rule_chunked: q, k [b, T, H, dk], v [b, T, H, dv], g, beta
    [b, T, H] (0 at padding), state [b, H, dk, dv] -> (o [b, T, H, dv], final state),
    float32. Computed by the recurrence token by token (the chunked form's result, to
    rounding), so `chunk_size` does not matter here."""
    require_triton("gated_delta_rule_chunked")
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    v = v if v.stride(-1) == 1 else v.contiguous()
    o = torch.empty(b, t, h, dv, dtype=torch.float32, device=q.device)
    new_state = torch.empty(b, h, dk, dv, dtype=torch.float32, device=q.device)
    if b == 0 or h == 0 or dv == 0:
        return o, new_state
    block_k = _pow2(dk, 16)
    block_v = min(_pow2(dv, 16), max(16, 2048 // block_k))
    _GATED_DELTA_SCAN.on(q.device)[(b, h, triton.cdiv(dv, block_v))](
        q, k, v, g, beta, state, o, new_state,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        g.stride(0), g.stride(1), g.stride(2), beta.stride(0), beta.stride(1), beta.stride(2),
        state.stride(0), state.stride(1), state.stride(2), state.stride(3),
        o.stride(0), o.stride(1), o.stride(2),
        new_state.stride(0), new_state.stride(1), new_state.stride(2), new_state.stride(3),
        t, dk, dv, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=4)
    return o, new_state


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """`t` as [rows, width] of unit channel stride (a view where it can be)."""
    t = t.reshape(-1, width)
    return t if t.stride(-1) == 1 else t.contiguous()


def gated_rms_norm(x: torch.Tensor, gate: Optional[torch.Tensor], weight: torch.Tensor,
                   group_size: int, eps: float,
                   gate_after: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ops.gated_rms_norm: weight * rmsnorm_per_group(x * silu(gate)) in the promoted
    dtype of weight and x; with `gate_after`, weight * rmsnorm_per_group(x) *
    silu(gate_after) in x's dtype."""
    require_triton("gated_rms_norm")
    hidden = x.shape[-1]
    if hidden % group_size:
        raise ValueError(f"{hidden} channels are not groups of {group_size}")
    out_dtype = x.dtype if gate_after is not None else torch.promote_types(weight.dtype,
                                                                           x.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel() == 0:
        return out
    gate_in = gate_after if gate_after is not None else gate
    x2 = _rows(x, hidden)
    g2 = _rows(gate_in, hidden) if gate_in is not None else x2
    o2 = out.view(-1, hidden)
    block = min(_pow2(group_size, 16), 2048)
    _GATED_RMS_NORM.on(x.device)[(x2.shape[0], hidden // group_size)](
        x2, g2, weight.contiguous(), o2, x2.stride(0), g2.stride(0), o2.stride(0),
        group_size, float(eps), HAS_GATE=gate_in is not None,
        GATE_AFTER=gate_after is not None, BLOCK=block,
        num_warps=4 if block <= 1024 else 8)
    return out
