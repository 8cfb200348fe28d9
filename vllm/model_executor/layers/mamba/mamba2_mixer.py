"""The Mamba2 mixer (transformers' Mamba2Mixer semantics), serving from state slots.

in_proj -> [gate | xBC | dt]; xBC through the causal conv1d (carried conv state) and
SiLU; x, B, C split; the SSD scan (carried SSM state) with D skip; gated RMSNorm with
the gate; out_proj. Per request the conv and SSM states live in the runner's state
slots (vllm/worker/state_cache.py): a prefill (or a chunk of one) continues from the
slot when the request computed tokens before, and writes its final states back; a
decode token takes the one-step forms.

Tensor parallelism: each rank holds `num_heads / tp` heads (its slice of the gate, x,
dt, A, D, the conv channels and the norm) and `n_groups / tp` B/C groups (all of them,
replicated, when n_groups is 1); in_proj and the conv are loaded as this rank's rows,
out_proj is row-parallel (one all-reduce). With one group the gated norm's group spans
every rank: its sum of squares is all-reduced.

The state-space ops (vllm/model_executor/layers/mamba/ops.py) are called through the
kernel table (`_op`): the platform's own kernels where it binds them (CUDA: Triton),
else the torch ops. Decodes of a flat batch update their slots in place
(`state_slots`); the other paths gather the slots' states and store the new ones.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.distributed import get_tp_group, tensor_model_parallel_all_reduce
from vllm.kv_cache_spec import MambaSpec
from vllm.model_executor.kernels import kernel
from vllm.model_executor.layers.linear import ReplicatedLinear, RowParallelLinear
from vllm.worker.state_cache import StateMetadata, get_state_metadata

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def state_dtypes(cache_config: Any, model_dtype: torch.dtype, hf_config: Any = None
                 ) -> tuple[torch.dtype, torch.dtype]:
    """(conv state dtype, SSM state dtype): vLLM's --mamba-cache-dtype (both) and
    --mamba-ssm-cache-dtype (the SSM state; "auto": the checkpoint config's
    `mamba_ssm_cache_dtype` if it names one, as Nemotron-H's float32, else the
    former), "auto" = the model's."""
    both = getattr(cache_config, "mamba_cache_dtype", "auto") or "auto"
    ssm = getattr(cache_config, "mamba_ssm_cache_dtype", "auto") or "auto"
    if ssm == "auto" and getattr(hf_config, "mamba_ssm_cache_dtype", None) in _DTYPES:
        ssm = hf_config.mamba_ssm_cache_dtype
    conv_dtype = model_dtype if both == "auto" else _DTYPES[both]
    ssm_dtype = conv_dtype if ssm == "auto" else _DTYPES[ssm]
    return conv_dtype, ssm_dtype


class Mamba2Mixer(nn.Module):

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, n_groups: int,
                 state_size: int, conv_kernel: int, intermediate_size: int, chunk_size: int,
                 eps: float, use_bias: bool = False, use_conv_bias: bool = True,
                 time_step_limit: tuple[float, float] = (0.0, float("inf")),
                 state_dtypes: tuple[torch.dtype, torch.dtype] = (torch.float32,) * 2,
                 prefix: str = "", norm: str = "gated", out_bias: Optional[bool] = None,
                 proj_multipliers: Optional[torch.Tensor] = None,
                 state_key: Optional[int] = None) -> None:
        """`norm`: "gated" (rmsnorm per group of x * silu(z), Mamba2's), "norm_then_gate"
        (rmsnorm per group, then * silu(z)) or "none" (x * silu(z), no weight; Falcon-H1
        without mamba_rms_norm). `proj_multipliers`: [full in_proj width] scales of the
        projection (Falcon-H1's muP vector). `state_key`: the key of this mixer's state
        (default the layer index; a layer that also holds attention uses another)."""
        super().__init__()
        self.layer_idx = extract_layer_index(prefix) if prefix else 0
        self.state_key = self.layer_idx if state_key is None else state_key
        self.norm_mode = norm
        tp = get_tp_group()
        self.tp_size, rank = tp.world_size, tp.rank_in_group
        if num_heads % self.tp_size or (n_groups % self.tp_size and n_groups != 1):
            raise ValueError(f"Mamba2 mixer: {num_heads} heads and {n_groups} groups cannot "
                             f"be split over {self.tp_size} tensor-parallel ranks (heads and "
                             "groups must divide by it, or one group).")
        heads, inter = num_heads // self.tp_size, intermediate_size // self.tp_size
        groups = n_groups // self.tp_size if n_groups % self.tp_size == 0 else n_groups
        self.num_heads, self.head_dim, self.n_groups = heads, head_dim, groups
        self.state_size, self.conv_kernel, self.chunk_size = state_size, conv_kernel, chunk_size
        self.intermediate_size = inter
        self.norm_group_size = intermediate_size // n_groups
        self.norm_across_ranks = self.norm_group_size > inter
        """One group wider than this rank's channels: the norm's sum is all-reduced."""
        self.conv_dim = inter + 2 * groups * state_size
        self.eps = eps
        self.time_step_limit = (float(time_step_limit[0]), float(time_step_limit[1]))
        self.conv_dtype, self.ssm_dtype = state_dtypes
        # This rank's rows of the full [gate | x | B | C | dt] projection and of the
        # [x | B | C] conv channels.
        gn = n_groups * state_size
        g0 = rank * groups if groups != n_groups else 0
        x_rows = torch.arange(rank * inter, (rank + 1) * inter)
        bc = torch.arange(g0 * state_size, (g0 + groups) * state_size)
        conv_rows = torch.cat([x_rows, intermediate_size + bc, intermediate_size + gn + bc])
        self._conv_rows = conv_rows
        self._in_rows = torch.cat([x_rows, intermediate_size + conv_rows,
                                   2 * intermediate_size + 2 * gn
                                   + torch.arange(rank * heads, (rank + 1) * heads)])
        self._head_rows = torch.arange(rank * heads, (rank + 1) * heads)
        self._inter_rows = x_rows
        self.in_proj = ReplicatedLinear(hidden_size, inter + self.conv_dim + heads,
                                        bias=use_bias, prefix=f"{prefix}.in_proj")
        dtype = torch.get_default_dtype()
        # checkpoint names (transformers'): conv1d.weight [C, 1, K], conv1d.bias, norm.weight
        self.conv1d = _Params(weight=(self.conv_dim, 1, conv_kernel),
                              bias=(self.conv_dim,) if use_conv_bias else None)
        self.norm = _Params(weight=(inter,) if norm != "none" else None)
        self.dt_bias = nn.Parameter(torch.zeros(heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(heads, dtype=dtype), requires_grad=False)
        self.D = nn.Parameter(torch.zeros(heads, dtype=dtype), requires_grad=False)
        self.out_proj = RowParallelLinear(intermediate_size, hidden_size,
                                          bias=use_bias if out_bias is None else out_bias,
                                          prefix=f"{prefix}.out_proj")
        self.proj_multipliers = (None if proj_multipliers is None else
                                 proj_multipliers.index_select(0, self._in_rows).to(dtype))
        # Checkpoint tensors are full; each parameter takes this rank's rows.
        for param, rows in ((self.in_proj.weight, self._in_rows),
                            (self.in_proj.bias, self._in_rows),
                            (self.conv1d.weight, conv_rows), (self.conv1d.bias, conv_rows),
                            (self.norm.weight, x_rows), (self.dt_bias, self._head_rows),
                            (self.A_log, self._head_rows), (self.D, self._head_rows)):
            if param is not None:
                param.weight_loader = _rows_loader(rows)

    @property
    def conv_weight(self) -> torch.Tensor:
        return self.conv1d.weight.view(self.conv_dim, self.conv_kernel)

    @property
    def conv_bias(self) -> Optional[torch.Tensor]:
        return self.conv1d.bias

    def state_spec(self, block_size: int) -> MambaSpec:
        return MambaSpec(block_size, (self.conv_dim, self.conv_kernel - 1),
                         (self.num_heads, self.head_dim, self.state_size),
                         self.conv_dtype, self.ssm_dtype)

    def _op(self, name: str):
        """State-space op `name` from the kernel table (vllm/model_executor/kernels.py),
        picked on first use and kept on the module (a plain attribute)."""
        fns = self.__dict__.setdefault("_ssm_ops", {})
        fn = fns.get(name)
        if fn is None:
            fn = fns[name] = kernel(name)
        return fn

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        proj = self.in_proj(hidden_states)
        if self.proj_multipliers is not None:
            proj = proj * self.proj_multipliers
        gate, xbc, dt = proj.split([self.intermediate_size, self.conv_dim, self.num_heads],
                                   dim=-1)
        md = get_state_metadata()
        if md is None:  # one sequence from a zero state (no runner)
            y = self._sequences(xbc[None], dt[None], None, None, None)[0][0]
        elif md.padded:
            y = self._padded(xbc, dt, md)
        else:
            y = self._flat(xbc, dt, md)
        if self.norm_mode == "none":
            y = (y.float() * torch.nn.functional.silu(gate.float())).to(y.dtype)
        elif self.norm_mode == "norm_then_gate":
            if self.norm_across_ranks:
                raise NotImplementedError("norm_then_gate over tensor-parallel ranks")
            y = self._op("gated_rms_norm")(y, None, self.norm.weight, self.norm_group_size,
                                           self.eps, gate_after=gate)
        elif self.norm_across_ranks:
            y = self._gated_norm_across_ranks(y, gate)
        else:
            y = self._op("gated_rms_norm")(y, gate, self.norm.weight, self.norm_group_size,
                                           self.eps)
        return self.out_proj(y.to(hidden_states.dtype))

    def _gated_norm_across_ranks(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """The one group's RMS over every rank's channels (TP with n_groups 1)."""
        h = y.float() * torch.nn.functional.silu(gate.float())
        ss = tensor_model_parallel_all_reduce(h.pow(2).sum(-1, keepdim=True))
        h = h * torch.rsqrt(ss / self.norm_group_size + self.eps)
        return self.norm.weight * h.to(y.dtype)

    def _dt(self, dt: torch.Tensor) -> torch.Tensor:
        dt = torch.nn.functional.softplus(dt.float() + self.dt_bias.float())
        lo, hi = self.time_step_limit
        if lo > 0.0 or hi != float("inf"):
            dt = dt.clamp(lo, hi)
        return dt

    def _split_xbc(self, xbc: torch.Tensor):
        gn = self.n_groups * self.state_size
        x, B, C = xbc.split([self.intermediate_size, gn, gn], dim=-1)
        lead = x.shape[:-1]
        return (x.reshape(*lead, self.num_heads, self.head_dim),
                B.reshape(*lead, self.n_groups, self.state_size),
                C.reshape(*lead, self.n_groups, self.state_size))

    def _sequences(self, xbc: torch.Tensor, dt: torch.Tensor, conv0: Optional[torch.Tensor],
                   ssm0: Optional[torch.Tensor], lengths: Optional[torch.Tensor]):
        """b sequences [b, T, ...] from the given states (None: zeros); returns
        (y [b, T, intermediate], conv state, SSM state)."""
        b, t = xbc.shape[:2]
        if conv0 is None:
            conv0 = xbc.new_zeros(b, self.conv_dim, self.conv_kernel - 1)
        if ssm0 is None:
            ssm0 = torch.zeros(b, self.num_heads, self.head_dim, self.state_size,
                               dtype=torch.float32, device=xbc.device)
        conv_out, conv1 = self._op("causal_conv1d")(xbc, self.conv_weight, self.conv_bias,
                                                    conv0, lengths)
        x, B, C = self._split_xbc(conv_out)
        dt = self._dt(dt)
        if lengths is not None:
            valid = torch.arange(t, device=xbc.device).view(1, t) < lengths.view(b, 1)
            dt = dt * valid.unsqueeze(-1)
        A = -torch.exp(self.A_log.float())
        y, ssm1 = self._op("ssd_chunk_scan")(x, dt, A, B, C, self.D, self.chunk_size, ssm0)
        return y.reshape(b, t, self.intermediate_size), conv1, ssm1

    def _step(self, xbc: torch.Tensor, dt: torch.Tensor, conv0: torch.Tensor,
              ssm0: torch.Tensor, slots: Optional[torch.Tensor] = None):
        """b decode tokens [b, ...]; returns (y [b, intermediate], conv, SSM states).
        With `slots`, conv0 / ssm0 are the slot caches, updated in place."""
        conv_out, conv1 = self._op("causal_conv1d_step")(xbc, self.conv_weight,
                                                         self.conv_bias, conv0, slots)
        x, B, C = self._split_xbc(conv_out)
        A = -torch.exp(self.A_log.float())
        y, ssm1 = self._op("ssd_step")(x, self._dt(dt), A, B, C, self.D, ssm0, slots)
        return y.reshape(-1, self.intermediate_size), conv1, ssm1

    def _initial(self, md: StateMetadata, slots: torch.Tensor, has_initial: torch.Tensor):
        conv_all, ssm_all = md.states[self.state_key]
        # a new or recomputing request starts from zeros
        conv0 = conv_all.index_select(0, slots)
        ssm0 = ssm_all.index_select(0, slots).float()
        conv0 = torch.where(has_initial.view(-1, *[1] * (conv0.dim() - 1)), conv0, 0.0)
        ssm0 = torch.where(has_initial.view(-1, *[1] * (ssm0.dim() - 1)), ssm0, 0.0)
        return conv0, ssm0

    def _store(self, md: StateMetadata, slots: torch.Tensor, conv1: torch.Tensor,
               ssm1: torch.Tensor) -> None:
        conv_all, ssm_all = md.states[self.state_key]
        conv_all.index_copy_(0, slots, conv1.to(conv_all.dtype))
        ssm_all.index_copy_(0, slots, ssm1.to(ssm_all.dtype))

    def _flat(self, xbc: torch.Tensor, dt: torch.Tensor, md: StateMetadata) -> torch.Tensor:
        """Token-major rows: decodes (one new token after computed ones) in one batch,
        each other sequence on its own."""
        y = xbc.new_empty(xbc.shape[0], self.intermediate_size, dtype=torch.float32)
        decode = [i for i, n in enumerate(md.num_tokens) if n == 1 and md.has_initial_list[i]]
        if decode:  # every slot holds its request's state: updated in place
            k = len(decode)
            rows_list = [md.row_offsets[i] for i in decode]
            caches = md.states[self.state_key]
            if decode == list(range(k)) and rows_list == list(range(k)):
                slots = md.slots[:k]  # the usual layout: decodes first, one row each
                y[:k] = self._step(xbc[:k], dt[:k], *caches, slots)[0]
            else:
                rows = torch.tensor(rows_list, device=xbc.device)
                slots = md.slots.index_select(0, torch.tensor(decode, device=xbc.device))
                out = self._step(xbc.index_select(0, rows), dt.index_select(0, rows),
                                 *caches, slots)[0]
                y.index_copy_(0, rows, out)
        done = set(decode)
        for i, (start, n) in enumerate(zip(md.row_offsets, md.num_tokens)):
            if i in done or n == 0:
                continue
            slots = md.slots[i:i + 1]
            conv0, ssm0 = self._initial(md, slots, md.has_initial[i:i + 1])
            out, conv1, ssm1 = self._sequences(xbc[None, start:start + n],
                                               dt[None, start:start + n], conv0, ssm0, None)
            y[start:start + n] = out[0]
            self._store(md, slots, conv1, ssm1)
        return y

    def _padded(self, xbc: torch.Tensor, dt: torch.Tensor, md: StateMetadata) -> torch.Tensor:
        """Fixed shapes: rows [b, T] (T = 1: decode), padding rows on the pad slot."""
        b = md.slots.shape[0]
        t = xbc.shape[0] // b
        conv0, ssm0 = self._initial(md, md.slots, md.has_initial)
        if t == 1:
            out, conv1, ssm1 = self._step(xbc, dt, conv0, ssm0)
        else:
            out, conv1, ssm1 = self._sequences(xbc.view(b, t, -1), dt.view(b, t, -1),
                                               conv0, ssm0, md.seq_lens)
            out = out.reshape(b * t, -1)
        self._store(md, md.slots, conv1, ssm1)
        return out


class _Params(nn.Module):
    """A module holding only named parameters (zeros), so checkpoint names match."""

    def __init__(self, **shapes: Optional[tuple[int, ...]]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            param = (nn.Parameter(torch.zeros(shape, dtype=torch.get_default_dtype()),
                                  requires_grad=False) if shape is not None else None)
            setattr(self, name, param)


def _rows_loader(rows: torch.Tensor):
    """A weight loader copying rows `rows` (dim 0) of the full checkpoint tensor."""
    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        part = loaded.index_select(0, rows.to(loaded.device))
        if part.shape != param.shape:
            raise ValueError(f"shape mismatch: rows of checkpoint {tuple(part.shape)}, "
                             f"parameter {tuple(param.shape)}.")
        param.data.copy_(part)
    return load
