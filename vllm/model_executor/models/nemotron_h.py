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

from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from vllm.model_executor.kernels import drop_weight_copies
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.llama import LlamaAttention
from vllm.model_executor.models.mamba2 import check_single_rank, mamba2_mixer_of
from vllm.model_executor.models.utils import attach_lm_head, check_loaded, default_weight_loader
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


class NemotronHForCausalLM(nn.Module):
    is_state_space = True
    _stacked = ((".q_proj.", ".qkv_proj.", "q"), (".k_proj.", ".qkv_proj.", "k"),
                (".v_proj.", ".qkv_proj.", "v"))

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        check_single_rank("NemotronHForCausalLM")
        config = vllm_config.model_config.hf_config
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.backbone = NemotronHModel(config, vllm_config)
        self.start_layer, self.end_layer = 0, config.num_hidden_layers
        attach_lm_head(self, config, "lm_head", True, True,
                       self.backbone.embeddings if self.tie_word_embeddings else None)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embeddings(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        return self.backbone(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        drop_weight_copies(self)
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            if name.startswith("model."):  # transformers-side saves may use either prefix
                name = "backbone." + name[len("model."):]
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue
            shard = None
            for old, new, sid in self._stacked:
                if old in name:
                    name, shard = name.replace(old, new), sid
                    break
            if name not in params:
                ignored.append(name)
                continue
            param = params[name]
            if shard is None:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
            loaded.add(name)
        if self.tie_word_embeddings:
            loaded.add("lm_head.weight")
        return check_loaded(params, loaded, ignored)
