"""Plain-torch kernels of the Mamba2 mixer, with batch-first fixed shapes.

Every function takes a batch of sequences padded to one length (`[b, T, ...]`) and a
per-sequence initial state, so the same code serves a flat CPU layout (one sequence
at a time, b = 1) and a bucketed HPU pass (padding rows masked by `lengths`). Padding
positions do not change the carried state: their conv input is taken as absent (the
final conv state is read at each sequence's own end) and their dt is 0, so the SSM
state decays by exp(0) = 1 and receives nothing.

- `causal_conv1d`: depthwise causal conv over a chunk, continuing from the carried
  conv state (the last K - 1 inputs), SiLU; returns the new conv state.
- `causal_conv1d_step`: the same for one new token (decode).
- `ssd_chunk_scan`: Mamba2's state-space duality scan, chunk by chunk: within a chunk
  a masked "attention" C·B weighted by the decay between positions, plus the carried
  state read out through C; the state is carried to the next chunk.
- `ssd_step`: the one-step recurrence (decode).
- `gated_rms_norm`: x * silu(gate), RMS-normalized per group of channels.

The one-token ops (`causal_conv1d_step`, `ssd_step`, `selective_step`,
`gated_delta_rule_step`) also take `state_slots` [b]: `state` is then the whole slot
cache `[num_slots, ...]`; rows `state_slots` are read, updated in place (in the cache's
dtype) and the cache is returned as the new state. Without it they return a new state
and leave `state` alone. The mixers call these through the kernel table
(vllm/model_executor/kernels.py), where a backend may bind its own (CUDA: Triton).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  conv_state: torch.Tensor, lengths: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [b, T, C], weight [C, K], conv_state [b, C, K - 1] (the inputs before x),
    lengths [b] (default T). Returns (silu(conv) [b, T, C], new conv state [b, C, K-1]:
    the last K - 1 inputs up to each sequence's end)."""
    b, t, c = x.shape
    k = weight.shape[-1]
    xt = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [b, C, K-1+T]
    out = F.conv1d(xt, weight.to(x.dtype).unsqueeze(1), bias, groups=c)  # [b, C, T]
    out = F.silu(out).transpose(1, 2)
    if lengths is None:
        new_state = xt[:, :, t:]
    else:  # inputs [len, len + K - 1) of xt: the K - 1 before each sequence's end
        idx = lengths.view(b, 1, 1) + torch.arange(k - 1, device=x.device).view(1, 1, k - 1)
        new_state = torch.gather(xt, 2, idx.expand(b, c, k - 1))
    return out, new_state


def _in_slots(step, cache: torch.Tensor, slots: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """`step(rows)` -> (y, new rows) on rows `slots` of `cache`, written back in place."""
    y, new = step(cache.index_select(0, slots))
    cache.index_copy_(0, slots, new.to(cache.dtype))
    return y, cache


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       conv_state: torch.Tensor, state_slots: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [b, C] one token each, conv_state [b, C, K - 1]; returns (silu(conv) [b, C],
    new conv state in x's dtype; with `state_slots`, see the module's docstring)."""
    if state_slots is not None:
        return _in_slots(lambda rows: causal_conv1d_step(x, weight, bias, rows),
                         conv_state, state_slots)
    window = torch.cat([conv_state.to(x.dtype), x.unsqueeze(-1)], dim=-1)  # [b, C, K]
    out = (window * weight.to(x.dtype)).sum(-1)
    if bias is not None:
        out = out + bias
    return F.silu(out), window[:, :, 1:]


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[..., G, N] groups -> [..., H, N] (each group serves H / G consecutive heads)."""
    groups = t.shape[-2]
    return t.repeat_interleave(num_heads // groups, dim=-2)


def ssd_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, chunk_size: int,
                   initial_state: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [b, T, H, P], dt [b, T, H] (softplus'ed, 0 at padding), A [H] (negative),
    B, C [b, T, G, N], D [H], initial_state [b, H, P, N]. Returns (y [b, T, H, P],
    final state [b, H, P, N]), in float32."""
    b, t, h, p = x.shape
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    B, C = _heads(B, h), _heads(C, h)
    state = initial_state.float()
    ys = []
    for start in range(0, t, chunk_size):
        end = min(start + chunk_size, t)
        xc, dtc, Bc, Cc = x[:, start:end], dt[:, start:end], B[:, start:end], C[:, start:end]
        a = torch.cumsum(dtc * A.float(), dim=1)                      # [b, L, H]
        length = end - start
        # decay from s to l (l >= s): exp(a[l] - a[s]); masked above the diagonal
        diff = a.unsqueeze(2) - a.unsqueeze(1)                        # [b, l, s, H]
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        decay = torch.exp(diff.masked_fill(~causal.view(1, length, length, 1), float("-inf")))
        scores = torch.einsum("blhn,bshn->blsh", Cc, Bc) * decay
        xdt = xc * dtc.unsqueeze(-1)                                  # [b, L, H, P]
        y = torch.einsum("blsh,bshp->blhp", scores, xdt)
        y = y + torch.einsum("blhn,bhpn->blhp", Cc, state) * torch.exp(a).unsqueeze(-1)
        ys.append(y)
        to_end = torch.exp(a[:, -1:] - a)                             # [b, L, H]
        state = (state * torch.exp(a[:, -1]).view(b, h, 1, 1)
                 + torch.einsum("blhn,blhp->bhpn", Bc * to_end.unsqueeze(-1), xdt))
    y = torch.cat(ys, dim=1) + x * D.float().view(1, 1, h, 1)
    return y, state


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
             state_slots: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: x [b, H, P], dt [b, H] (softplus'ed), A, D [H], B, C [b, G, N],
    state [b, H, P, N]. Returns (y [b, H, P], new state), in float32."""
    if state_slots is not None:
        return _in_slots(lambda rows: ssd_step(x, dt, A, B, C, D, rows), state, state_slots)
    b, h, p = x.shape
    x, dt = x.float(), dt.float()
    B, C = _heads(B.float(), h), _heads(C.float(), h)
    decay = torch.exp(dt * A.float())                                 # [b, H]
    # one pass over the state: state * decay + (dt x) outer B, in place on a float copy
    state = state.float() if state.dtype != torch.float32 else state.clone()
    state.mul_(decay[..., None, None])
    state.addcmul_((dt[..., None] * x).unsqueeze(-1), B.unsqueeze(2))
    y = torch.bmm(state.view(b * h, p, -1), C.reshape(b * h, -1, 1)).view(b, h, p)
    return y + x * D.float().view(1, h, 1), state


def gated_rms_norm(x: torch.Tensor, gate: Optional[torch.Tensor], weight: torch.Tensor,
                   group_size: int, eps: float,
                   gate_after: Optional[torch.Tensor] = None) -> torch.Tensor:
    """weight * rmsnorm_per_group(x * silu(gate)) (Mamba2's norm before out_proj); with
    `gate_after` instead: weight * rmsnorm_per_group(x) * silu(gate_after) (Falcon-H1's
    norm_before_gate)."""
    dtype = x.dtype
    h = x.float() if gate is None else x.float() * F.silu(gate.float())
    shape = h.shape
    g = h.view(*shape[:-1], shape[-1] // group_size, group_size)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    if gate_after is None:
        return weight * g.view(shape).to(dtype)
    return (weight * g.view(shape) * F.silu(gate_after.float())).to(dtype)


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, state: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba1's selective scan, token by token: x, dt [b, T, d] (dt softplus'ed, 0 at
    padding), A [d, n] (negative), B, C [b, T, n], D [d], state [b, d, n]. Returns
    (y [b, T, d], final state), float32: h = exp(dt A) h + dt B x, y = C.h + D x."""
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    h = state.float().clone()
    A = A.float()
    ys = []
    for t in range(x.shape[1]):
        h.mul_(torch.exp(dt[:, t, :, None] * A))
        h.addcmul_((dt[:, t] * x[:, t]).unsqueeze(-1), B[:, t, None, :])
        ys.append(torch.bmm(h, C[:, t, :, None]).squeeze(-1))
    y = torch.stack(ys, dim=1) + x * D.float()
    return y, h


def selective_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                   state_slots: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of `selective_scan`: x, dt [b, d], B, C [b, n], state [b, d, n]."""
    if state_slots is not None:
        return _in_slots(lambda rows: selective_step(x, dt, A, B, C, D, rows), state,
                         state_slots)
    y, h = selective_scan(x[:, None], dt[:, None], A, B[:, None], C[:, None], D, state)
    return y[:, 0], h


def gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                          state_slots: Optional[torch.Tensor] = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule (Gated DeltaNet, Qwen3-Next's linear
    attention): q, k [b, H, dk] (normalized and scaled by the caller), v [b, H, dv],
    g [b, H] (log decay, <= 0), beta [b, H], state [b, H, dk, dv]:
    S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. Returns (o, S), float32."""
    if state_slots is not None:
        return _in_slots(lambda rows: gated_delta_rule_step(q, k, v, g, beta, rows), state,
                         state_slots)
    S = state.float() * torch.exp(g.float())[..., None, None]
    k, q = k.float(), q.float()
    delta = (v.float() - torch.einsum("bhkv,bhk->bhv", S, k)) * beta.float()[..., None]
    S = S + k[..., :, None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                             chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a chunk of tokens, chunk by chunk: q, k [b, T, H, dk],
    v [b, T, H, dv], g, beta [b, T, H] (padding: g = beta = 0 leaves the state alone),
    state [b, H, dk, dv]. Within a chunk, with G the cumulative log decay, the state
    after token t is exp(G_t) S0 + sum_{s<=t} exp(G_t - G_s) k_s u_s^T, where the
    pseudo-values U solve the unit lower-triangular system
    (I + strict_tril(beta_t exp(G_t - G_s) k_t.k_s)) U = beta (V - exp(G) K S0);
    outputs are exp(G) Q S0 + tril(exp(G_t - G_s) q_t.k_s) U. Returns (o [b, T, H, dv],
    final state), float32."""
    q, k, v, g, beta = q.float(), k.float(), v.float(), g.float(), beta.float()
    S = state.float()
    outs = []
    for start in range(0, q.shape[1], chunk_size):
        end = min(start + chunk_size, q.shape[1])
        qc, kc, vc = (t[:, start:end].transpose(1, 2) for t in (q, k, v))  # [b, H, L, d]
        G = torch.cumsum(g[:, start:end], dim=1).transpose(1, 2)           # [b, H, L]
        bc = beta[:, start:end].transpose(1, 2)                             # [b, H, L]
        n = end - start
        diff = G[..., :, None] - G[..., None, :]                            # [b, H, t, s]
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp(diff.masked_fill(~lower, float("-inf")))
        eG = torch.exp(G)[..., None]
        rhs = bc[..., None] * (vc - eG * (kc @ S))
        A = (bc[..., None] * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
        eye = torch.eye(n, dtype=A.dtype, device=A.device)
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        outs.append(eG * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ U)
        to_end = torch.exp(G[..., -1:] - G)[..., None]                      # [b, H, L, 1]
        S = torch.exp(G[..., -1])[..., None, None] * S + (kc * to_end).transpose(-1, -2) @ U
    return torch.cat(outs, dim=2).transpose(1, 2), S
