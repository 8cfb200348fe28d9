"""DeepSeek-V2 / V2-Lite / V3 (and R1): multi-head latent attention + DeepSeek MoE.

Attention (MLA, vllm/attention/mla.py): the query comes from `q_proj` (V2-Lite, no
`q_lora_rank`) or the low-rank `q_a_proj -> q_a_layernorm -> q_b_proj`; keys and values
from one compressed latent, `kv_a_proj_with_mqa` -> `[c (kv_lora_rank) | k_pe
(qk_rope_head_dim)]`, `c` normed by `kv_a_layernorm` and expanded per head by
`kv_b_proj` into `k_nope` and `v`. Only the rope part is rotated (interleaved pairs, as
the released checkpoints store it; a V3 config with `rope_interleave=False` rotates
halves), with YaRN scaling when the config asks, whose `mscale_all_dim` also scales
the softmax. The KV cache holds `[c | k_pe]` per token.

MoE (layers from `first_k_dense_replace` on, every `moe_layer_freq`-th; the others a
dense SwiGLU MLP): `n_shared_experts` always-on experts (one MLP of
`n_shared_experts * moe_intermediate_size`) plus routed experts through FusedMoE:
- V2: softmax scores, top-k (`greedy`) or group-limited top-k
  (`group_limited_greedy`: the `topk_group` groups with the best expert);
- V3: sigmoid scores, `e_score_correction_bias` added for the choice, groups ranked by
  the sum of their two best experts (`noaux_tc`);
- the kept weights renormalized with `norm_topk_prob` (as DeepSeek's own code and vLLM
  do; transformers' V2 port ignores the flag, which released V2 configs leave off), then
  multiplied by `routed_scaling_factor`.
TP shards heads and experts' intermediate size (one all-reduce per MoE block).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.attention.mla import MLAAttention
from vllm.distributed import (get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_reduce)
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (ColumnParallelLinear, ReplicatedLinear,
                                               RowParallelLinear, divide)
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from vllm.model_executor.layers.rotary_yarn import yarn_softmax_scale
from vllm.model_executor.models.llama import (LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP,
                                              LlamaModel)
from vllm.model_executor.models.mixtral import MoECausalLMMixin
from vllm.model_executor.models.qwen2_moe import SharedExpertMLP
from vllm.model_executor.models.utils import rope_config


class DeepseekV2MLAAttention(nn.Module):
    """Projections of MLA around the latent-cache attention layer."""

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        self.num_heads = divide(total_heads, get_tensor_model_parallel_world_size(),
                                "num_attention_heads")
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = config.v_head_dim, config.kv_lora_rank
        self.qk_head_dim = self.nope + self.rope
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        bias = bool(getattr(config, "attention_bias", False))
        if self.q_lora_rank is not None:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, bias=bias,
                                             prefix=f"{prefix}.q_a_proj")
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=config.rms_norm_eps)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank,
                                                 total_heads * self.qk_head_dim, bias=False,
                                                 prefix=f"{prefix}.q_b_proj")
        else:
            self.q_proj = ColumnParallelLinear(hidden, total_heads * self.qk_head_dim,
                                               bias=False, prefix=f"{prefix}.q_proj")
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.kv_lora_rank + self.rope,
                                                   bias=bias,
                                                   prefix=f"{prefix}.kv_a_proj_with_mqa")
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank,
                                              total_heads * (self.nope + self.v_head_dim),
                                              bias=False, prefix=f"{prefix}.kv_b_proj")
        self.o_proj = RowParallelLinear(total_heads * self.v_head_dim, hidden, bias=bias,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = rotary_emb
        _, scaling = rope_config(config)
        scale = yarn_softmax_scale(self.qk_head_dim ** -0.5, scaling)
        self.attn = MLAAttention(self.num_heads, self.nope, self.rope, self.v_head_dim,
                                 self.kv_lora_rank, scale, self.kv_b_proj,
                                 prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        t = hidden_states.shape[0]
        if self.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        else:
            q = self.q_proj(hidden_states)
        q = q.view(t, self.num_heads, self.qk_head_dim)
        latent = self.kv_a_proj_with_mqa(hidden_states)
        kv_c, k_pe = latent.split([self.kv_lora_rank, self.rope], dim=-1)
        kv_c = self.kv_a_layernorm(kv_c.contiguous())
        q_pe, k_pe = self.rotary_emb(positions, q[..., self.nope:].contiguous(),
                                     k_pe.contiguous())
        q = torch.cat((q[..., :self.nope], q_pe.view(t, self.num_heads, self.rope)), dim=-1)
        return self.o_proj(self.attn(q, kv_c, k_pe.view(t, self.rope)))


class DeepseekV2MoE(nn.Module):
    """Router (`gate`, + V3's correction bias), routed FusedMoE experts, shared experts;
    one all-reduce over TP at the end."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        hidden, experts = config.hidden_size, config.n_routed_experts
        self.gate = ReplicatedLinear(hidden, experts, bias=False, prefix=f"{prefix}.gate")
        method = getattr(config, "topk_method", None) or "greedy"
        v3 = method == "noaux_tc" or getattr(config, "model_type", "") == "deepseek_v3"
        bias = None
        if v3:
            bias = nn.Parameter(torch.zeros(experts, dtype=torch.float32), requires_grad=False)
            self.gate.e_score_correction_bias = bias
        grouped = v3 or method == "group_limited_greedy"
        if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ValueError(f"topk_method {method!r} is not supported; expected 'greedy', "
                             "'group_limited_greedy' or 'noaux_tc'.")
        self.experts = FusedMoE(
            experts, config.num_experts_per_tok, hidden, config.moe_intermediate_size,
            renormalize=bool(getattr(config, "norm_topk_prob", False)),
            reduce_results=False, activation=config.hidden_act, prefix=f"{prefix}.experts",
            scoring_func="sigmoid" if v3 else "softmax",
            num_expert_group=config.n_group if grouped else None,
            topk_group=config.topk_group if grouped else None,
            routed_scaling_factor=float(getattr(config, "routed_scaling_factor", 1.0) or 1.0),
            e_score_correction_bias=bias)
        shared = getattr(config, "n_shared_experts", None) or 0
        self.shared_experts = (SharedExpertMLP(hidden, config.moe_intermediate_size * shared,
                                               prefix=f"{prefix}.shared_experts")
                               if shared else None)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.experts(hidden_states, self.gate(hidden_states))
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        if self.experts.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out


def is_moe_layer(config: Any, layer_idx: int) -> bool:
    """vLLM's rule: routed experts exist, past the first dense layers, every
    `moe_layer_freq`-th layer."""
    return (getattr(config, "n_routed_experts", None) is not None
            and layer_idx >= (getattr(config, "first_k_dense_replace", 0) or 0)
            and layer_idx % (getattr(config, "moe_layer_freq", 1) or 1) == 0)


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    attention_cls = DeepseekV2MLAAttention

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        if is_moe_layer(config, extract_layer_index(prefix)):
            return DeepseekV2MoE(config, prefix=prefix)
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                        prefix=prefix)


class DeepseekV2Model(LlamaModel):
    layer_cls = DeepseekV2DecoderLayer

    def build_rotary_emb(self, config: Any) -> RotaryEmbedding:
        """Rotary over the rope part only; interleaved pairs unless a V3 config says
        `rope_interleave=False`."""
        theta, scaling = rope_config(config)
        neox = (getattr(config, "model_type", "") == "deepseek_v3"
                and getattr(config, "rope_interleave", True) is False)
        rope = config.qk_rope_head_dim
        return get_rope(rope, rope, config.max_position_embeddings, theta, scaling,
                        is_neox_style=neox)


class DeepseekV2ForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = DeepseekV2Model
    packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
    # Only the MLPs are fused (q_proj / kv projections stay separate in MLA).
    _stacked_params = (("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 / R1: the V2 classes; the config (model_type `deepseek_v3`,
    `n_group`, `e_score_correction_bias` in the checkpoint) selects V3's routing."""
