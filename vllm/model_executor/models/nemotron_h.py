"""Nemotron-H (transformers' NemotronHForCausalLM): a decoder of single-mixer blocks,
`x + mixer(norm(x))`, where each block's mixer is, per `hybrid_override_pattern` (M,
*, -) or `layers_block_type`:

- "M" / linear_attention: a Mamba2 mixer (heads `mamba_num_heads` x `mamba_head_dim`,
  its conv and SSM states in the runner's state slots);
- "*" / full_attention: attention without rotary (the paged KV cache);
- "-" / mlp: up_proj -> relu^2 -> down_proj.

The checkpoint is under `backbone.` (embeddings, layers.N.norm / .mixer, norm_f) with an
untied `lm_head`. MoE blocks ("E", Nemotron 3) are not implemented and refused by name;
prefix caching is off (state layers); pipeline parallelism is not implemented yet.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import nn

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.llama import LlamaAttention
from vllm.model_executor.models.mamba2 import Mamba2ForCausalLM, mamba2_mixer_of
from vllm.sequence import IntermediateTensors

_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention",
          "attention": "attention", "mlp": "mlp", "moe": "moe"}


def block_types(config: Any) -> list[str]:
    pattern = getattr(config, "hybrid_override_pattern", None)
    if pattern:
        return [_PATTERN[c] for c in pattern]
    return [_TYPES[t] for t in config.layers_block_type]


class NoRopeAttention(LlamaAttention):
    """q/k/v -> paged attention -> o, no positional rotation."""

    fused_decode_ok = False

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor):
        return tuple(qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1))


class Relu2MLP(nn.Module):

    def __init__(self, hidden: int, intermediate: int, bias: bool, prefix: str) -> None:
        super().__init__()
        self.up_proj = ColumnParallelLinear(hidden, intermediate, bias=bias,
                                            prefix=f"{prefix}.up_proj")
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias,
                                           prefix=f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class NemotronHBlock(nn.Module):

    def __init__(self, config: Any, vllm_config: Any, kind: str, prefix: str) -> None:
        super().__init__()
        if kind == "moe":
            raise NotImplementedError("NemotronHForCausalLM: 'moe' blocks (Nemotron 3 "
                                      "mixture of experts) are not implemented yet.")
        self.norm = RMSNorm(config.hidden_size, eps=float(config.layer_norm_epsilon))
        if kind == "mamba":
            heads, head_dim = config.mamba_num_heads, config.mamba_head_dim
            self.mixer = mamba2_mixer_of(
                config, vllm_config, f"{prefix}.mixer", num_heads=heads, head_dim=head_dim,
                n_groups=config.n_groups, state_size=config.ssm_state_size,
                conv_kernel=config.conv_kernel, intermediate_size=heads * head_dim,
                chunk_size=config.chunk_size, eps=float(config.layer_norm_epsilon),
                use_bias=bool(getattr(config, "use_bias", False)),
                use_conv_bias=bool(getattr(config, "use_conv_bias", True)))
        elif kind == "attention":
            self.mixer = NoRopeAttention(config, None, prefix=f"{prefix}.mixer")
        elif kind == "mlp":
            self.mixer = Relu2MLP(config.hidden_size, config.intermediate_size,
                                  bool(getattr(config, "mlp_bias", False)), f"{prefix}.mixer")
        else:
            raise ValueError(f"NemotronHForCausalLM: unknown block type {kind!r}.")
        self.kind = kind
        self.residual_in_fp32 = bool(getattr(config, "residual_in_fp32", False))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(hidden)
        out = self.mixer(positions, x) if self.kind == "attention" else self.mixer(x)
        if self.residual_in_fp32:
            return (hidden.float() + out.float()).to(hidden.dtype)
        return hidden + out


class NemotronHModel(nn.Module):

    def __init__(self, config: Any, vllm_config: Any, prefix: str = "backbone") -> None:
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                 prefix=f"{prefix}.embeddings")
        self.layers = nn.ModuleList([
            NemotronHBlock(config, vllm_config, kind, f"{prefix}.layers.{i}")
            for i, kind in enumerate(block_types(config))])
        self.norm_f = RMSNorm(config.hidden_size, eps=float(config.layer_norm_epsilon))

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embeddings(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm_f(hidden)


class NemotronHForCausalLM(Mamba2ForCausalLM):
    backbone_cls = NemotronHModel
    _stacked = ((".q_proj.", ".qkv_proj.", "q"), (".k_proj.", ".qkv_proj.", "k"),
                (".v_proj.", ".qkv_proj.", "v"))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        return self.backbone(input_ids, positions, inputs_embeds)

    def _rename(self, name: str) -> str:
        """transformers-side saves may use `model.` for the backbone."""
        return "backbone." + name[len("model."):] if name.startswith("model.") else name
