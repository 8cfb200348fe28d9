"""All experts of one MoE block in two stacked weights, sharded over TP ranks.

`w13_weight` [E, 2 * I_tp, H] holds each expert's gate (w1) and up (w3) rows of this
rank, `w2_weight` [E, H, I_tp] its down projection columns: the intermediate
dimension is split as in a dense column/row-parallel MLP, so every rank computes
every expert for every routed token and one all-reduce sums the partial outputs.

Checkpoints store experts one by one (`experts.{e}.w1.weight`, or `gate_proj`/
`up_proj`/`down_proj`); `weight_loader(param, tensor, shard_id, expert_id)` places
each into its slot. Models map names with `expert_param_name`.

Forward (custom op `fused_moe`, bound per platform like every kernel):
- native (CUDA, others): tokens are grouped by expert (one sort of the routing table),
  and each expert that received rows runs one GEMM pass over all of them: a loop over
  experts, never over tokens.
- CPU (vllm/cpu/ops.py): the same grouping, each expert's GEMMs on weights packed
  once for the native bf16 kernel.
- HPU (vllm/hpu/ops.py): Gaudi's `mixture_of_experts` op on the (bucket-padded) batch,
  a fixed shape per bucket, so no graph depends on how tokens were routed.
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
                 expert_parallel: Optional[bool] = None) -> None:
        super().__init__()
        if expert_parallel is None:
            expert_parallel = _EXPERT_PARALLEL[0]
        self.scoring_func = scoring_func
        self.num_expert_group, self.topk_group = num_expert_group, topk_group
        self.routed_scaling_factor = float(routed_scaling_factor)
        # [E] float32 added to the scores for the choice only (DeepSeek-V3). Owned and
        # loaded by the router; held in a tuple so it is not registered twice.
        self._correction_bias = (e_score_correction_bias,)
        if activation != "silu":
            raise ValueError(f"MoE activation {activation!r} is not supported; only 'silu'.")
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
        for p in (self.w13_weight, self.w2_weight):
            p.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      shard_id: str, expert_id: int) -> None:
        """Copy this rank's slice of one expert's w1 (gate), w3 (up) or w2 (down); experts
        of other expert-parallel ranks are skipped."""
        n = self.intermediate_size_per_partition
        full = n * self.moe_tp_size
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
            gate, up = linear13(expert, x.index_select(0, rows)).chunk(2, dim=-1)
            y = linear2(expert, F.silu(gate) * up)
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
                f"renormalize={self.renormalize}")
