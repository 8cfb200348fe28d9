"""Granite 4 hybrid (transformers' GraniteMoeHybridForCausalLM): Granite's multipliers
on a decoder whose layers are Mamba2 mixers or attention, per `layer_types`
("linear_attention" / "mamba": a mixer with its conv and SSM states in the runner's
state slots; "full_attention" / "attention": paged KV cache attention, rotary only
with `position_embedding_type` "rope", none otherwise), each followed by the shared
SwiGLU MLP (`shared_mlp.input_linear` = [gate; up]) plus, with `num_local_experts` >
0, GraniteMoE's sparse MoE block.

Prefix caching is off for it (vllm/core/kv_cache_manager.py: the mixers' states are
not snapshotted at block boundaries). Pipeline parallelism: not yet.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.granite import (GraniteAttention, GraniteDecoderLayer,
                                                GraniteForCausalLM, GraniteModel)
from vllm.model_executor.models.granitemoe import unstack_experts
from vllm.model_executor.models.llama import LlamaMLP
from vllm.model_executor.models.mamba2 import check_single_rank, mamba2_mixer_of
from vllm.model_executor.models.mixtral import MoECausalLMMixin, SparseMoeBlock

_MAMBA_TYPES = ("mamba", "linear_attention")


def _uses_rope(config: Any) -> bool:
    return getattr(config, "position_embedding_type", None) == "rope"


class GraniteHybridAttention(GraniteAttention):

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor):
        if self.rotary_emb is not None:
            return super().rotate_qk(positions, qkv)
        return tuple(qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1))


class GraniteMoeHybridDecoderLayer(GraniteDecoderLayer):
    attention_cls = GraniteHybridAttention

    def __init__(self, config: Any, rotary_emb: Optional[RotaryEmbedding],
                 prefix: str = "") -> None:
        nn.Module.__init__(self)
        from vllm.model_executor.layers.layernorm import RMSNorm
        idx = extract_layer_index(prefix)
        self.is_mamba = config.layer_types[idx] in _MAMBA_TYPES
        if self.is_mamba:
            self.mamba = mamba2_mixer_of(
                config, config._vllm_config, f"{prefix}.mamba", num_heads=config.mamba_n_heads,
                head_dim=config.mamba_d_head, n_groups=config.mamba_n_groups,
                state_size=config.mamba_d_state, conv_kernel=config.mamba_d_conv,
                intermediate_size=int(config.mamba_expand * config.hidden_size),
                chunk_size=config.mamba_chunk_size, eps=float(config.rms_norm_eps),
                use_bias=bool(config.mamba_proj_bias),
                use_conv_bias=bool(config.mamba_conv_bias))
        else:
            self.self_attn = self.attention_cls(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.shared_mlp = LlamaMLP(config.hidden_size, config.shared_intermediate_size,
                                   config.hidden_act, prefix=f"{prefix}.shared_mlp")
        self.mlp = (SparseMoeBlock(config.hidden_size, config.num_local_experts,
                                   config.num_experts_per_tok, config.intermediate_size,
                                   renormalize=True, hidden_act=config.hidden_act,
                                   prefix=f"{prefix}.mlp")
                    if config.num_local_experts > 0 else None)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.is_mamba:
            hidden_states = self.mamba(hidden_states)
        else:
            hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(
            hidden_states * self.residual_multiplier, residual)
        out = self.shared_mlp(hidden_states)
        if self.mlp is not None:
            out = out + self.mlp(hidden_states)
        return out * self.residual_multiplier, residual


class GraniteMoeHybridModel(GraniteModel):
    layer_cls = GraniteMoeHybridDecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        # the layers build their mixers with the engine's state dtypes
        vllm_config.model_config.hf_config._vllm_config = vllm_config
        try:
            super().__init__(vllm_config, prefix)
        finally:
            del vllm_config.model_config.hf_config._vllm_config

    def build_rotary_emb(self, config: Any) -> Optional[RotaryEmbedding]:
        return super().build_rotary_emb(config) if _uses_rope(config) else None


def _split_shared_mlp(weights: Iterable[tuple[str, torch.Tensor]]
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """`shared_mlp.input_linear` [gate; up] and `output_linear` under LlamaMLP's names."""
    for name, tensor in weights:
        if ".shared_mlp.input_linear." in name:
            gate, up = tensor.chunk(2, dim=0)
            yield name.replace(".input_linear.", ".gate_proj."), gate
            yield name.replace(".input_linear.", ".up_proj."), up
        elif ".shared_mlp.output_linear." in name:
            yield name.replace(".output_linear.", ".down_proj."), tensor
        else:
            yield name, tensor


class GraniteMoeHybridForCausalLM(MoECausalLMMixin, GraniteForCausalLM):
    model_cls = GraniteMoeHybridModel
    is_state_space = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        check_single_rank("GraniteMoeHybridForCausalLM")
        super().__init__(vllm_config, prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_split_shared_mlp(unstack_experts(weights)))
