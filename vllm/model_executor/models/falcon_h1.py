"""Falcon-H1 (transformers' FalconH1ForCausalLM): every layer runs a Mamba2 mixer and
attention side by side on the same normed input and adds both to the residual, then a
SwiGLU MLP; muP multipliers throughout:

- embeddings x `embedding_multiplier`, logits x `lm_head_multiplier`;
- mixer input x `ssm_in_multiplier`, its in_proj output x the muP vector of
  `ssm_multipliers` (z, x, B, C, dt parts), output x `ssm_out_multiplier`;
- attention input x `attention_in_multiplier`, keys x `key_multiplier`, output x
  `attention_out_multiplier` (rotary, scale head_dim^-0.5);
- MLP: down(up(x) * silu(gate(x) * m0)) * m1 with `mlp_multipliers` = (m0, m1).

The mixer's gate: `mamba_rms_norm` False: y * silu(z); True: a group RMSNorm before
(`mamba_norm_before_gate`) or after the gate. Each layer holds attention (KV cache under
its layer index) and a state (keyed `num_hidden_layers + layer`). Prefix caching is
off (state layers); pipeline parallelism is not implemented.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.mamba.mamba2_mixer import Mamba2Mixer, state_dtypes
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel
from vllm.model_executor.models.mamba2 import check_single_rank
from vllm.sequence import IntermediateTensors


def mup_vector(config: Any, intermediate: int) -> torch.Tensor:
    gn = config.mamba_n_groups * config.mamba_d_state
    m = [float(v) for v in config.ssm_multipliers]
    sizes = [intermediate, intermediate, gn, gn, config.mamba_n_heads]
    return torch.cat([torch.full((n,), v) for n, v in zip(sizes, m)])


class FalconH1Attention(LlamaAttention):
    fused_decode_ok = False

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.key_multiplier = float(config.key_multiplier)

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor):
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k * self.key_multiplier)
        return q, k, v


class FalconH1MLP(LlamaMLP):

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__(config.hidden_size, config.intermediate_size, config.hidden_act,
                         bias=bool(config.mlp_bias), prefix=prefix)
        self.gate_multiplier, self.down_multiplier = (float(v) for v in config.mlp_multipliers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        h = up * torch.nn.functional.silu(gate * self.gate_multiplier)
        return self.down_proj(h) * self.down_multiplier


class FalconH1DecoderLayer(nn.Module):

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        idx = extract_layer_index(prefix)
        vllm_config = config._vllm_config
        inter = (config.mamba_d_ssm if config.mamba_d_ssm is not None
                 else int(config.mamba_expand * config.hidden_size))
        limit = getattr(config, "time_step_limit", None) or (0.0, float("inf"))
        norm = ("none" if not config.mamba_rms_norm else
                "norm_then_gate" if config.mamba_norm_before_gate else "gated")
        self.mamba = Mamba2Mixer(
            config.hidden_size, config.mamba_n_heads, config.mamba_d_head,
            config.mamba_n_groups, config.mamba_d_state, config.mamba_d_conv, inter,
            config.mamba_chunk_size, float(config.rms_norm_eps),
            use_bias=bool(config.mamba_proj_bias), use_conv_bias=bool(config.mamba_conv_bias),
            time_step_limit=tuple(limit),
            state_dtypes=state_dtypes(vllm_config.cache_config,
                                      vllm_config.model_config.torch_dtype, config),
            prefix=f"{prefix}.mamba", norm=norm, out_bias=bool(config.projectors_bias),
            proj_multipliers=mup_vector(config, inter),
            state_key=config.num_hidden_layers + idx)
        self.self_attn = FalconH1Attention(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.feed_forward = FalconH1MLP(config, prefix=f"{prefix}.feed_forward")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ssm_in = float(config.ssm_in_multiplier)
        self.ssm_out = float(config.ssm_out_multiplier)
        self.attn_in = float(config.attention_in_multiplier)
        self.attn_out = float(config.attention_out_multiplier)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, None]:
        x = self.input_layernorm(hidden)
        mixed = self.mamba(x * self.ssm_in) * self.ssm_out
        mixed = mixed + self.self_attn(positions, x * self.attn_in) * self.attn_out
        hidden = hidden + mixed
        return hidden + self.feed_forward(self.pre_ff_layernorm(hidden)), None


class FalconH1Model(LlamaModel):
    layer_cls = FalconH1DecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        config = vllm_config.model_config.hf_config
        config._vllm_config = vllm_config
        try:
            super().__init__(vllm_config, prefix)
        finally:
            del config._vllm_config
        self.embedding_multiplier = float(config.embedding_multiplier)
        self.final_layernorm = self.norm
        del self.norm

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        hidden = hidden * self.embedding_multiplier
        for layer in self._own_layers:
            hidden, _ = layer(positions, hidden, None)
        return self.final_layernorm(hidden)


class FalconH1ForCausalLM(LlamaForCausalLM):
    model_cls = FalconH1Model
    is_state_space = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        check_single_rank("FalconH1ForCausalLM")
        super().__init__(vllm_config, prefix)
        self.logits_processor.scale = float(self.config.lm_head_multiplier)
