"""Jamba (transformers' JambaForCausalLM): Llama-style pre-norm blocks whose mixer is
attention (no rotary) every `attn_layer_period` layers from `attn_layer_offset`, else a
Mamba1 mixer (vllm/model_executor/layers/mamba/mamba1_mixer.py, its conv and SSM states
in the runner's state slots); the feed-forward is a sparse MoE (softmax top-k, weights
not renormalized) every `expert_layer_period` layers from `expert_layer_offset`, else a
SwiGLU MLP. Checkpoint names: `mamba.*`, `self_attn.*`, `feed_forward.*` (router, experts
or gate/up/down), `pre_ff_layernorm`, `model.final_layernorm`.

Prefix caching is off (state layers); tensor (the Mamba1 mixer) and pipeline
parallelism are not implemented yet.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.mamba.mamba1_mixer import Mamba1Mixer
from vllm.model_executor.layers.mamba.mamba2_mixer import state_dtypes
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import (LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP,
                                              LlamaModel)
from vllm.model_executor.models.mamba2 import check_single_rank
from vllm.model_executor.models.mixtral import MoECausalLMMixin, SparseMoeBlock
from vllm.model_executor.models.nemotron_h import NoRopeAttention


def _is_attention(config: Any, idx: int) -> bool:
    return idx % config.attn_layer_period == config.attn_layer_offset


def _has_experts(config: Any, idx: int) -> bool:
    return (config.num_experts > 1
            and idx % config.expert_layer_period == config.expert_layer_offset)


class JambaDecoderLayer(LlamaDecoderLayer):
    attention_cls = NoRopeAttention

    def __init__(self, config: Any, rotary_emb: Optional[RotaryEmbedding],
                 prefix: str = "") -> None:
        nn.Module.__init__(self)
        idx = extract_layer_index(prefix)
        self.is_mamba = not _is_attention(config, idx)
        if self.is_mamba:
            vllm_config = config._vllm_config
            self.mamba = Mamba1Mixer(
                config.hidden_size, int(config.mamba_expand * config.hidden_size),
                config.mamba_d_state, config.mamba_d_conv, config.mamba_dt_rank,
                float(config.rms_norm_eps), use_bias=bool(config.mamba_proj_bias),
                use_conv_bias=bool(config.mamba_conv_bias),
                state_dtypes=state_dtypes(vllm_config.cache_config,
                                          vllm_config.model_config.torch_dtype),
                prefix=f"{prefix}.mamba")
        else:
            self.self_attn = self.attention_cls(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.feed_forward = (
            SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                           config.intermediate_size, renormalize=False,
                           hidden_act=config.hidden_act, prefix=f"{prefix}.feed_forward")
            if _has_experts(config, idx) else
            LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                     prefix=f"{prefix}.feed_forward"))
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.feed_forward(hidden_states), residual


class JambaModel(LlamaModel):
    layer_cls = JambaDecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        vllm_config.model_config.hf_config._vllm_config = vllm_config
        try:
            super().__init__(vllm_config, prefix)
        finally:
            del vllm_config.model_config.hf_config._vllm_config

    def build_rotary_emb(self, config: Any) -> None:
        return None  # Jamba's attention has no positional encoding


def _jamba_names(weights: Iterable[tuple[str, torch.Tensor]]
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        name = (name.replace(".feed_forward.router.", ".feed_forward.gate.")
                .replace(".pre_ff_layernorm.", ".post_attention_layernorm.")
                .replace("model.final_layernorm.", "model.norm."))
        yield name, tensor


class JambaForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = JambaModel
    is_state_space = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        check_single_rank("JambaForCausalLM")
        super().__init__(vllm_config, prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_jamba_names(weights))
