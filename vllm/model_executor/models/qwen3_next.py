"""Qwen3-Next (transformers' Qwen3NextForCausalLM): per `layer_types`, a Gated DeltaNet
linear attention (vllm/model_executor/layers/mamba/gated_deltanet.py, its conv and
recurrent states in the runner's state slots) or a gated full attention (q_proj gives
the query and a per-head output gate: o * sigmoid(gate); q/k RMSNorms per head;
partial rotary), each followed by Qwen2-MoE's sparse block (routed experts + sigmoid-
gated shared expert) or a dense SwiGLU MLP; every RMSNorm outside the linear attention
stores its weight as an offset from 1 (as Gemma's).

Qwen3.5 (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`: transformers' text models of the
same design) differs only in the linear attention's plain projections (in_proj_qkv, _z,
_b, _a) and, for the dense one, an MLP in every layer.

Prefix caching is off (state layers); tensor and pipeline parallelism are not
implemented for it yet.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vllm.attention import Attention
from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.gemma_layers import GemmaRMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.mamba.gated_deltanet import GatedDeltaNetMixer
from vllm.model_executor.layers.mamba.mamba2_mixer import state_dtypes
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from vllm.model_executor.models.mamba2 import check_single_rank
from vllm.model_executor.models.mixtral import MoECausalLMMixin
from vllm.model_executor.models.qwen2_moe import Qwen2MoeSparseMoeBlock, is_sparse_layer
from vllm.model_executor.models.utils import head_dim_of


class Qwen3NextAttention(nn.Module):

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        self.head_dim = head_dim_of(config)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        bias = bool(getattr(config, "attention_bias", False))
        h = config.hidden_size
        self.q_proj = ReplicatedLinear(h, self.num_heads * self.head_dim * 2, bias=bias,
                                       prefix=f"{prefix}.q_proj")
        self.k_proj = ReplicatedLinear(h, self.num_kv_heads * self.head_dim, bias=bias,
                                       prefix=f"{prefix}.k_proj")
        self.v_proj = ReplicatedLinear(h, self.num_kv_heads * self.head_dim, bias=bias,
                                       prefix=f"{prefix}.v_proj")
        self.o_proj = ReplicatedLinear(self.num_heads * self.head_dim, h, bias=bias,
                                       prefix=f"{prefix}.o_proj")
        self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                              self.num_kv_heads, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        t = hidden_states.shape[0]
        q, gate = self.q_proj(hidden_states).view(t, self.num_heads, 2 * self.head_dim).chunk(
            2, dim=-1)
        q = self.q_norm(q.contiguous()).reshape(t, -1)
        k = self.k_norm(self.k_proj(hidden_states).view(t, self.num_kv_heads, self.head_dim))
        k = k.reshape(t, -1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, self.v_proj(hidden_states))
        return self.o_proj(out * torch.sigmoid(gate.reshape(t, -1)))


class Qwen3NextDecoderLayer(LlamaDecoderLayer):

    def __init__(self, config: Any, rotary_emb: Optional[RotaryEmbedding],
                 prefix: str = "") -> None:
        nn.Module.__init__(self)
        idx = extract_layer_index(prefix)
        self.is_linear = config.layer_types[idx] == "linear_attention"
        if self.is_linear:
            vllm_config = config._vllm_config
            self.linear_attn = GatedDeltaNetMixer(
                config.hidden_size, config.linear_num_key_heads, config.linear_num_value_heads,
                config.linear_key_head_dim, config.linear_value_head_dim,
                config.linear_conv_kernel_dim, float(config.rms_norm_eps),
                state_dtypes=state_dtypes(vllm_config.cache_config,
                                          vllm_config.model_config.torch_dtype, config),
                prefix=f"{prefix}.linear_attn",
                split_projections=config.model_type.startswith("qwen3_5"))
        else:
            self.self_attn = Qwen3NextAttention(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.mlp = (Qwen2MoeSparseMoeBlock(config, prefix=f"{prefix}.mlp")
                    if getattr(config, "num_experts", 0) and is_sparse_layer(config, idx) else
                    LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                             prefix=f"{prefix}.mlp"))
        if (isinstance(self.mlp, Qwen2MoeSparseMoeBlock)
                and config.model_type.startswith("qwen3_5")):
            self.mlp.experts.renormalize = True  # Qwen3.5-MoE's router always renormalizes
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.is_linear:
            hidden_states = self.linear_attn(hidden_states)
        else:
            hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen3NextModel(LlamaModel):
    layer_cls = Qwen3NextDecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        config = vllm_config.model_config.hf_config
        config._vllm_config = vllm_config
        try:
            super().__init__(vllm_config, prefix)
        finally:
            del config._vllm_config
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Qwen3NextForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = Qwen3NextModel
    is_state_space = True
    packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
    _stacked_params = (("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        check_single_rank("Qwen3NextForCausalLM")
        super().__init__(vllm_config, prefix)
