"""All experts of one MoE block in two stacked weights, sharded over TP ranks.

`w13_weight` [E, 2 * I_tp, H] holds each expert's gate (w1) and up (w3) rows of this
rank, `w2_weight` [E, H, I_tp] its down projection columns: the intermediate
dimension is split as in a dense column/row-parallel MLP, so every rank computes
every expert for every routed token and one all-reduce sums the partial outputs.

Checkpoints store experts one by one (`experts.{e}.w1.weight`, or `gate_proj`/
`up_proj`/`down_proj`); `weight_loader(param, tensor, shard_id, expert_id)` places
each into its slot. Models map names with `expert_param_name`. Checkpoints that stack
all experts in one tensor (GPT-OSS) are cut into experts by the model first; gate and
up rows that a checkpoint interleaves are split by the model too, so `w13_weight`
always holds [gate | up].

Activations: "silu" (SwiGLU: silu(gate) * up) and "swigluoai" (GPT-OSS: gate clamped
above at `swiglu_limit`, up clamped to +-limit, `(up + 1) * gate * sigmoid(alpha *
gate)`). With `has_bias` the experts carry `w13_bias` [E, 2 * I_tp] (this rank's gate
and up slices) and `w2_bias` [E, H], which only the first rank of an expert's TP
group holds (zeros elsewhere), so the all-reduce adds it once.

Forward (custom op `fused_moe`, bound per platform like every kernel):
- native (CUDA, others): tokens are grouped by expert (one sort of the routing table),
  and each expert that received rows runs one GEMM pass over all of them: a loop over
  experts, never over tokens.
- CPU (vllm/cpu/ops.py): the same grouping, each expert's GEMMs on weights packed
  once for the native bf16 kernel.
- HPU (vllm/hpu/ops.py): Gaudi's `mixture_of_experts` op on the (bucket-padded) batch,
  a fixed shape per bucket, so no graph depends on how tokens were routed. The op
  knows neither expert biases nor the swigluoai activation: such layers take
  `dense_experts` (every local expert over every row, weighted by its routing weight,
  zero where not routed), the same fixed shapes at E / top_k times the expert work.
Every form routes (`select_experts`) and all-reduces the same way (`FusedMoE.run`).
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.distributed import (get_tensor_model_parallel_rank,
                              get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_reduce)
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.fused_moe.routing import select_experts
from vllm.model_executor.layers.linear import divide


_EXPERT_WEIGHT = re.compile(
    r"\.experts\.(\d+)\.(w1|w2|w3|gate_proj|down_proj|up_proj)\.weight$")
_SHARD_OF = {"w1": "w1", "gate_proj": "w1", "w3": "w3", "up_proj": "w3", "w2": "w2",
             "down_proj": "w2"}


def expert_param_name(name: str) -> Optional[tuple[str, tuple[str, int]]]:
    """(parameter name, (shard id, expert id)) of a per-expert checkpoint tensor, else None.

    "model.layers.0.mlp.experts.3.up_proj.weight" ->
    ("model.layers.0.mlp.experts.w13_weight", ("w3", 3)).
    """
    m = _EXPERT_WEIGHT.search(name)
    if m is None:
        return None
    shard = _SHARD_OF[m.group(2)]
    param = "w2_weight" if shard == "w2" else "w13_weight"
    return f"{name[:m.start()]}.experts.{param}", (shard, int(m.group(1)))


_EXPERT_PARALLEL = [False]


@contextlib.contextmanager
def expert_parallel_scope(enabled: bool) -> Iterator[None]:
    """While a model is built, its FusedMoE layers split experts over the TP ranks
    (ParallelConfig.enable_expert_parallel; set by the model loader)."""
    old = _EXPERT_PARALLEL[0]
    _EXPERT_PARALLEL[0] = bool(enabled)
    try:
        yield
    finally:
        _EXPERT_PARALLEL[0] = old


ACTIVATIONS = ("silu", "swigluoai")
"""Expert activations: SwiGLU, and GPT-OSS's clamped variant (see the module doc)."""


ExpertsFn = Callable[["FusedMoE", torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(layer, hidden [T, H], topk_weights [T, k], topk_ids [T, k]) -> [T, H] before the
TP all-reduce: the part of the op each platform computes its own way."""
ExpertLinear = Callable[[int, torch.Tensor], torch.Tensor]
"""(expert, rows) -> rows through that expert's w13 (or w2)."""


@CustomOp.register("fused_moe")
class FusedMoE(CustomOp):
    """SwiGLU experts; `forward(hidden [T, H], router_logits [T, E]) -> [T, H]`."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int,
                 intermediate_size: int, renormalize: bool = True,
                 reduce_results: bool = True, activation: str = "silu",
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "",
                 scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
                 topk_group: Optional[int] = None, routed_scaling_factor: float = 1.0,
                 e_score_correction_bias: Optional[torch.Tensor] = None,
                 expert_parallel: Optional[bool] = None, has_bias: bool = False,
                 swiglu_limit: Optional[float] = None,
                 swiglu_alpha: float = 1.702) -> None:
        super().__init__()
        if expert_parallel is None:
            expert_parallel = _EXPERT_PARALLEL[0]
        self.scoring_func = scoring_func
        self.num_expert_group, self.topk_group = num_expert_group, topk_group
        self.routed_scaling_factor = float(routed_scaling_factor)
        # [E] float32 added to the scores for the choice only (DeepSeek-V3). Owned and
        # loaded by the router; held in a tuple so it is not registered twice.
        self._correction_bias = (e_score_correction_bias,)
        if activation not in ACTIVATIONS:
            raise ValueError(f"MoE activation {activation!r} is not supported; choose one "
                             f"of {', '.join(ACTIVATIONS)}.")
        self.swiglu_limit = None if swiglu_limit is None else float(swiglu_limit)
        self.swiglu_alpha = float(swiglu_alpha)
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k ({top_k}) must be in [1, num_experts={num_experts}].")
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden_size = hidden_size
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        # Expert parallel (vLLM's --enable-expert-parallel): the TP ranks split the
        # experts, each holding whole experts; otherwise each rank holds a slice of
        # every expert's intermediate dimension. Either way every rank sees all tokens
        # (attention is TP) and the block's one all-reduce sums the partial outputs.
        self.ep_size, self.ep_rank = ((self.tp_size, self.tp_rank) if expert_parallel
                                      else (1, 0))
        self.local_num_experts = divide(num_experts, self.ep_size,
                                        f"number of experts of {prefix or 'layer'}")
        self.expert_start = self.ep_rank * self.local_num_experts
        self.moe_tp_size, self.moe_tp_rank = ((1, 0) if expert_parallel
                                              else (self.tp_size, self.tp_rank))
        self.intermediate_size_per_partition = divide(
            intermediate_size, self.moe_tp_size,
            f"moe intermediate size of {prefix or 'layer'}")
        self.renormalize = renormalize
        self.reduce_results = reduce_results
        self.activation = activation
        self.prefix = prefix
        dtype = params_dtype or torch.get_default_dtype()
        n = self.intermediate_size_per_partition
        local = self.local_num_experts
        self.w13_weight = nn.Parameter(torch.empty(local, 2 * n, hidden_size, dtype=dtype),
                                       requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(local, hidden_size, n, dtype=dtype),
                                      requires_grad=False)
        self.w13_bias: Optional[nn.Parameter] = None
        self.w2_bias: Optional[nn.Parameter] = None
        if has_bias:
            self.w13_bias = nn.Parameter(torch.zeros(local, 2 * n, dtype=dtype),
                                         requires_grad=False)
            self.w2_bias = nn.Parameter(torch.zeros(local, hidden_size, dtype=dtype),
                                        requires_grad=False)
        for p in (self.w13_weight, self.w2_weight, self.w13_bias, self.w2_bias):
            if p is not None:
                p.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      shard_id: str, expert_id: int) -> None:
        """Copy this rank's slice of one expert's w1 (gate), w3 (up) or w2 (down) weight,
        or bias when `param` is a bias; experts of other expert-parallel ranks are
        skipped."""
        n = self.intermediate_size_per_partition
        full = n * self.moe_tp_size
        if param is self.w13_bias or param is self.w2_bias:
            self._load_bias(param, loaded_weight, shard_id, expert_id)
            return
        expected = {"w1": (full, self.hidden_size), "w3": (full, self.hidden_size),
                    "w2": (self.hidden_size, full)}.get(shard_id)
        if expected is not None and tuple(loaded_weight.shape) != expected:
            raise ValueError(f"shape mismatch loading {self.prefix} expert {expert_id} "
                             f"{shard_id}: checkpoint {tuple(loaded_weight.shape)}, expected "
                             f"{expected}.")
        local = expert_id - self.expert_start
        if not 0 <= local < self.local_num_experts:
            return
        if shard_id in ("w1", "w3"):
            src = loaded_weight.narrow(0, self.moe_tp_rank * n, n)
            dst = param.data[local].narrow(0, 0 if shard_id == "w1" else n, n)
        elif shard_id == "w2":
            src = loaded_weight.narrow(1, self.moe_tp_rank * n, n)
            dst = param.data[local]
        else:
            raise ValueError(f"shard_id must be 'w1', 'w2' or 'w3', got {shard_id!r}.")
        dst.copy_(src)

    def _load_bias(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str,
                   expert_id: int) -> None:
        n = self.intermediate_size_per_partition
        expected = (self.hidden_size,) if shard_id == "w2" else (n * self.moe_tp_size,)
        if shard_id not in ("w1", "w2", "w3") or (shard_id == "w2") != (param is self.w2_bias):
            raise ValueError(f"bias shard_id {shard_id!r} does not fit {self.prefix}'s "
                             f"{'w2' if param is self.w2_bias else 'w13'}_bias.")
        if tuple(loaded_weight.shape) != expected:
            raise ValueError(f"shape mismatch loading {self.prefix} expert {expert_id} "
                             f"{shard_id} bias: checkpoint {tuple(loaded_weight.shape)}, "
                             f"expected {expected}.")
        local = expert_id - self.expert_start
        if not 0 <= local < self.local_num_experts:
            return
        if shard_id == "w2":
            # One rank of the expert's TP group adds the bias; the all-reduce sums.
            param.data[local].copy_(loaded_weight if self.moe_tp_rank == 0
                                    else torch.zeros_like(loaded_weight))
        else:
            dst = param.data[local].narrow(0, 0 if shard_id == "w1" else n, n)
            dst.copy_(loaded_weight.narrow(0, self.moe_tp_rank * n, n))

    def act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 * I_tp] gate | up -> [rows, I_tp] by the layer's activation."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self.activation == "silu":
            return F.silu(gate) * up
        limit = self.swiglu_limit
        if limit is not None:
            gate = gate.clamp(max=limit)
            up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.swiglu_alpha))

    def expert_mlp(self, expert: int, rows: torch.Tensor, linear13: ExpertLinear,
                   linear2: ExpertLinear) -> torch.Tensor:
        """One expert on `rows`: w13 (+ bias), activation, w2 (+ bias)."""
        h = linear13(expert, rows)
        if self.w13_bias is not None:
            h = h + self.w13_bias[expert]
        y = linear2(expert, self.act_and_mul(h))
        if self.w2_bias is not None:
            y = y + self.w2_bias[expert]
        return y

    @property
    def needs_dense_experts(self) -> bool:
        """Whether Gaudi's fused MoE op cannot express this layer (biases, swigluoai)."""
        return self.activation != "silu" or self.w13_bias is not None

    def dense_experts(self, x: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
        """Every local expert over every row, weighted by its routing weight (0 where the
        row did not choose it), summed in ascending expert order: shapes that depend on
        the batch only, never on the routing (the HPU's form for layers its fused op
        cannot express)."""
        out = torch.zeros_like(x)
        for expert in range(self.local_num_experts):
            weight = (topk_weights * (topk_ids == expert)).sum(-1, keepdim=True)
            y = self.expert_mlp(expert, x, lambda e, xs: F.linear(xs, self.w13_weight[e]),
                                lambda e, xs: F.linear(xs, self.w2_weight[e]))
            out += y * weight.to(y.dtype)
        return out

    def run(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
            experts: ExpertsFn) -> torch.Tensor:
        """Route, compute the experts with `experts`, all-reduce over TP: every
        platform's forward is this with its own `experts`."""
        topk_weights, topk_ids = select_experts(
            router_logits, self.top_k, self.renormalize, self.scoring_func,
            self.num_expert_group, self.topk_group, self._correction_bias[0],
            self.routed_scaling_factor)
        if self.ep_size > 1:
            topk_weights, topk_ids = self.to_local_experts(topk_weights, topk_ids)
        out = experts(self, hidden_states, topk_weights, topk_ids)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

    def to_local_experts(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Global expert ids -> this rank's (0 .. local_num_experts - 1); a choice of
        another rank's expert becomes `local_num_experts` (no expert) with weight 0."""
        local = topk_ids - self.expert_start
        mine = (local >= 0) & (local < self.local_num_experts)
        return (topk_weights * mine, torch.where(mine, local, self.local_num_experts))

    def forward_native(self, hidden_states: torch.Tensor,
                       router_logits: torch.Tensor) -> torch.Tensor:
        return self.run(hidden_states, router_logits, FusedMoE.grouped_torch)

    def grouped_torch(self, x: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
        """`grouped` with torch's linear on the stacked weights."""
        return self.grouped(x, topk_weights, topk_ids,
                            lambda e, xs: F.linear(xs, self.w13_weight[e]),
                            lambda e, xs: F.linear(xs, self.w2_weight[e]))

    def grouped(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                linear13: ExpertLinear, linear2: ExpertLinear) -> torch.Tensor:
        """One GEMM pass per routed expert over the rows routed to it.

        Expert outputs land in one buffer in routing order; each token then sums its
        k rows in ascending expert order (the order of an expert-by-expert
        `index_add_`, as transformers does, without its slow bf16 CPU kernel)."""
        flat_ids = topk_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        token_of = order // self.top_k  # row of x for each sorted (token, slot)
        weight_of = topk_weights.reshape(-1)[order]
        # Ids run to local_num_experts: the "no expert" of expert parallel (zero rows).
        slots = self.local_num_experts + 1
        counts = torch.bincount(flat_ids, minlength=slots).tolist()
        alloc = torch.zeros if self.ep_size > 1 else torch.empty
        ys = alloc(flat_ids.numel(), self.hidden_size, dtype=x.dtype, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0 or expert == self.local_num_experts:
                start += count
                continue
            rows = token_of[start:start + count]
            y = self.expert_mlp(expert, x.index_select(0, rows), linear13, linear2)
            ys[start:start + count] = y * weight_of[start:start + count, None].to(y.dtype)
            start += count
        by_token = torch.argsort(token_of * slots + flat_ids[order])
        per_token = ys[by_token].view(x.shape[0], self.top_k, self.hidden_size)
        out = per_token[:, 0].clone()
        for slot in range(1, self.top_k):
            out += per_token[:, slot]
        return out

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, top_k={self.top_k}, "
                f"hidden={self.hidden_size}, intermediate={self.intermediate_size_per_partition}"
                f"x{self.moe_tp_size}, local_experts={self.local_num_experts}, "
                f"renormalize={self.renormalize}, activation={self.activation}, "
                f"bias={self.w13_bias is not None}")
