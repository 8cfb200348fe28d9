"""Mamba2 kernels (vllm/model_executor/layers/mamba/ops.py) against a float64
token-by-token reference: the conv over a chunk and its one-step form, the chunked SSD
scan carrying the state across chunks (and across calls: a prompt in two pieces equals
one), its one-step recurrence, padding rows that leave the state alone, gated RMSNorm."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.mamba import ops

H, P, G, N, K = 4, 8, 2, 16, 4
C_DIM = 24


def _ref_conv(x, w, bias, state):
    """x [T, C]; state [C, K-1]: the inputs before x. Sequential, float64."""
    hist = torch.cat([state.T, x], 0).double()
    out = torch.stack([(hist[t:t + K].T * w.double()).sum(-1) + bias.double()
                       for t in range(x.shape[0])])
    return F.silu(out), hist[-(K - 1):].T


def _ref_scan(x, dt, A, B, C, D, state):
    """x [T, H, P] ... one token at a time, float64."""
    state = state.double().clone()
    B = B.double().repeat_interleave(H // G, dim=1)
    C = C.double().repeat_interleave(H // G, dim=1)
    ys = []
    for t in range(x.shape[0]):
        dA = torch.exp(dt[t].double() * A.double())
        state = state * dA[:, None, None] + (dt[t].double()[:, None] * x[t].double())[..., None] \
            * B[t][:, None, :]
        ys.append(torch.einsum("hpn,hn->hp", state, C[t]) + x[t].double() * D.double()[:, None])
    return torch.stack(ys), state


def _inputs(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, P, generator=g)
    dt = F.softplus(torch.randn(T, H, generator=g))
    A = -torch.rand(H, generator=g) * 2 - 0.1
    B = torch.randn(T, G, N, generator=g)
    C = torch.randn(T, G, N, generator=g)
    D = torch.randn(H, generator=g)
    s0 = torch.randn(H, P, N, generator=g)
    return x, dt, A, B, C, D, s0


def test_conv_chunk_and_step_match_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(11, C_DIM, generator=g)
    w, bias = torch.randn(C_DIM, K, generator=g), torch.randn(C_DIM, generator=g)
    state = torch.randn(C_DIM, K - 1, generator=g)
    ref, ref_state = _ref_conv(x, w, bias, state)
    out, new_state = ops.causal_conv1d(x[None], w, bias, state[None])
    torch.testing.assert_close(out[0].double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_state[0].double(), ref_state)
    # token by token through the step form
    s = state[None]
    for t in range(11):
        y, s = ops.causal_conv1d_step(x[t][None], w, bias, s)
        torch.testing.assert_close(y[0].double(), ref[t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s[0].double(), ref_state)
    # padded batch: the second row is 4 tokens long
    xb = torch.stack([x, torch.cat([x[:4], torch.randn(7, C_DIM)])])
    out, st = ops.causal_conv1d(xb, w, bias, torch.stack([state, state]),
                                lengths=torch.tensor([11, 4]))
    ref4, ref4_state = _ref_conv(x[:4], w, bias, state)
    torch.testing.assert_close(out[1, :4].double(), ref4, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(st[1].double(), ref4_state)
    torch.testing.assert_close(st[0].double(), ref_state)


def test_chunked_scan_matches_reference_across_chunks_and_calls():
    x, dt, A, B, C, D, s0 = _inputs(37)
    ref_y, ref_s = _ref_scan(x, dt, A, B, C, D, s0)
    for chunk in (8, 16, 64):
        y, s = ops.ssd_chunk_scan(x[None], dt[None], A, B[None], C[None], D, chunk, s0[None])
        torch.testing.assert_close(y[0].double(), ref_y, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(s[0].double(), ref_s, atol=1e-4, rtol=1e-4)
    # the prompt in two calls (chunked prefill), the state carried between them
    y1, s1 = ops.ssd_chunk_scan(x[None, :20], dt[None, :20], A, B[None, :20], C[None, :20],
                                D, 8, s0[None])
    y2, s2 = ops.ssd_chunk_scan(x[None, 20:], dt[None, 20:], A, B[None, 20:], C[None, 20:],
                                D, 8, s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1)[0].double(), ref_y, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s2[0].double(), ref_s, atol=1e-4, rtol=1e-4)


def test_step_recurrence_and_padding_rows():
    x, dt, A, B, C, D, s0 = _inputs(5, seed=3)
    ref_y, ref_s = _ref_scan(x, dt, A, B, C, D, s0)
    s = s0[None]
    for t in range(5):
        y, s = ops.ssd_step(x[t][None], dt[t][None], A, B[t][None], C[t][None], D, s)
        torch.testing.assert_close(y[0].double(), ref_y[t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s[0].double(), ref_s, atol=1e-5, rtol=1e-5)
    # a padded tail (dt = 0) leaves the final state as it was after the real tokens
    pad = 6
    xp = torch.cat([x, torch.randn(pad, H, P)])
    dtp = torch.cat([dt, torch.zeros(pad, H)])
    Bp, Cp = torch.cat([B, torch.randn(pad, G, N)]), torch.cat([C, torch.randn(pad, G, N)])
    y, s = ops.ssd_chunk_scan(xp[None], dtp[None], A, Bp[None], Cp[None], D, 4, s0[None])
    torch.testing.assert_close(s[0].double(), ref_s, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y[0, :5].double(), ref_y, atol=1e-4, rtol=1e-4)


def test_gated_rms_norm():
    g = torch.Generator().manual_seed(2)
    x, z, w = torch.randn(3, 32, generator=g), torch.randn(3, 32, generator=g), \
        torch.randn(32, generator=g)
    h = x.double() * F.silu(z.double())
    hg = h.view(3, 4, 8)
    ref = (hg / torch.sqrt(hg.pow(2).mean(-1, keepdim=True) + 1e-5)).view(3, 32) * w.double()
    torch.testing.assert_close(ops.gated_rms_norm(x, z, w, 8, 1e-5).double(), ref,
                               atol=1e-5, rtol=1e-5)


def test_mamba1_selective_scan_matches_reference_and_carries_state():
    g = torch.Generator().manual_seed(5)
    T, d, n = 13, 6, 4
    x, dt = torch.randn(T, d, generator=g), F.softplus(torch.randn(T, d, generator=g))
    A, D = -torch.rand(d, n, generator=g) - 0.1, torch.randn(d, generator=g)
    B, C = torch.randn(T, n, generator=g), torch.randn(T, n, generator=g)
    h0 = torch.randn(d, n, generator=g)
    h, ref = h0.double(), []
    for t in range(T):  # float64, written out per channel and state entry
        h = torch.exp(dt[t].double()[:, None] * A.double()) * h \
            + dt[t].double()[:, None] * x[t].double()[:, None] * B[t].double()[None, :]
        ref.append((h * C[t].double()[None, :]).sum(-1) + D.double() * x[t].double())
    ref = torch.stack(ref)
    y1, s1 = ops.selective_scan(x[None, :7], dt[None, :7], A, B[None, :7], C[None, :7], D,
                                h0[None])
    ys = [y1[0]]
    s = s1
    for t in range(7, T):  # the rest one step at a time (decode), from the carried state
        y, s = ops.selective_step(x[None, t], dt[None, t], A, B[None, t], C[None, t], D, s)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys).double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s[0].double(), h, atol=1e-5, rtol=1e-5)


def test_gated_delta_rule_chunked_and_step_match_reference():
    """Gated DeltaNet (Qwen3-Next's linear attention): the chunked form (several chunk
    sizes, state carried across chunks and calls, a padded tail) and the one-step form
    against a float64 token-by-token recurrence."""
    g0 = torch.Generator().manual_seed(7)
    b, T, H, dk, dv = 2, 19, 3, 8, 5
    q = F.normalize(torch.randn(b, T, H, dk, generator=g0), dim=-1) * dk ** -0.5
    k = F.normalize(torch.randn(b, T, H, dk, generator=g0), dim=-1)
    v = torch.randn(b, T, H, dv, generator=g0)
    g = -F.softplus(torch.randn(b, T, H, generator=g0))
    beta = torch.sigmoid(torch.randn(b, T, H, generator=g0))
    s0 = torch.randn(b, H, dk, dv, generator=g0) * 0.1
    S, ref = s0.double(), []
    for t in range(T):
        S = S * torch.exp(g[:, t].double())[..., None, None]
        kt = k[:, t].double()
        delta = (v[:, t].double() - torch.einsum("bhkv,bhk->bhv", S, kt)) \
            * beta[:, t].double()[..., None]
        S = S + kt[..., :, None] * delta[..., None, :]
        ref.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t].double()))
    ref = torch.stack(ref, dim=1)
    for chunk in (4, 8, 64):
        o, s = ops.gated_delta_rule_chunked(q, k, v, g, beta, s0, chunk)
        torch.testing.assert_close(o.double(), ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(s.double(), S, atol=1e-4, rtol=1e-4)
    o1, s1 = ops.gated_delta_rule_chunked(q[:, :11], k[:, :11], v[:, :11], g[:, :11],
                                          beta[:, :11], s0, 4)
    outs = [o1]
    for t in range(11, T):  # decode from the carried state
        o, s1 = ops.gated_delta_rule_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], s1)
        outs.append(o[:, None])
    torch.testing.assert_close(torch.cat(outs, 1).double(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s1.double(), S, atol=1e-4, rtol=1e-4)
    pad = torch.zeros(b, 5, H)
    o, s = ops.gated_delta_rule_chunked(
        torch.cat([q, torch.randn(b, 5, H, dk)], 1), torch.cat([k, torch.randn(b, 5, H, dk)], 1),
        torch.cat([v, torch.randn(b, 5, H, dv)], 1), torch.cat([g, pad], 1),
        torch.cat([beta, pad], 1), s0, 8)
    torch.testing.assert_close(s.double(), S, atol=1e-4, rtol=1e-4)
