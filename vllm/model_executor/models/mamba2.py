"""Mamba2 (transformers' Mamba2ForCausalLM): an attention-free decoder of Mamba2 mixers.

`backbone.embeddings` -> per layer `x + mixer(norm(x))` (the residual in float32 with
`residual_in_fp32`) -> `backbone.norm_f` -> `lm_head` (tied to the embeddings with
`tie_word_embeddings`). Each mixer keeps a conv and an SSM state per request in the
runner's state slots (vllm/model_executor/layers/mamba/mamba2_mixer.py); there is no
KV cache. Tensor parallelism splits the mixers' heads; pipeline parallelism is not
implemented for it.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from vllm.distributed import get_pp_group
from vllm.model_executor.kernels import drop_weight_copies
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.mamba.mamba2_mixer import Mamba2Mixer, state_dtypes
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.utils import (attach_lm_head, check_loaded,
                                              default_weight_loader)
from vllm.sequence import IntermediateTensors


def mamba2_mixer_of(config: Any, vllm_config: Any, prefix: str, *, num_heads: int,
                    head_dim: int, n_groups: int, state_size: int, conv_kernel: int,
                    intermediate_size: int, chunk_size: int, eps: float,
                    use_bias: bool = False, use_conv_bias: bool = True) -> Mamba2Mixer:
    """A mixer of this model's state dtypes (--mamba-cache-dtype and co.)."""
    limit = getattr(config, "time_step_limit", None) or (0.0, float("inf"))
    return Mamba2Mixer(config.hidden_size, num_heads, head_dim, n_groups, state_size,
                       conv_kernel, intermediate_size, chunk_size, eps, use_bias=use_bias,
                       use_conv_bias=use_conv_bias, time_step_limit=tuple(limit),
                       state_dtypes=state_dtypes(vllm_config.cache_config,
                                                 vllm_config.model_config.torch_dtype,
                                                 config),
                       prefix=prefix)


def check_single_rank(arch: str) -> None:
    """Tensor parallelism splits the mixers' heads (mamba2_mixer.py); pipeline stages
    are not implemented for these models yet."""
    if get_pp_group().world_size > 1:
        raise NotImplementedError(f"{arch}: pipeline parallelism is not implemented for "
                                  "models with state-space layers yet.")


class Mamba2Block(nn.Module):

    def __init__(self, config: Any, vllm_config: Any, prefix: str) -> None:
        super().__init__()
        eps = float(config.layer_norm_epsilon)
        self.norm = RMSNorm(config.hidden_size, eps=eps)
        self.mixer = mamba2_mixer_of(
            config, vllm_config, f"{prefix}.mixer", num_heads=config.num_heads,
            head_dim=config.head_dim, n_groups=config.n_groups, state_size=config.state_size,
            conv_kernel=config.conv_kernel,
            intermediate_size=int(config.expand * config.hidden_size),
            chunk_size=config.chunk_size, eps=eps, use_bias=bool(config.use_bias),
            use_conv_bias=bool(config.use_conv_bias))
        self.residual_in_fp32 = bool(getattr(config, "residual_in_fp32", True))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.mixer(self.norm(hidden))
        if self.residual_in_fp32:
            return (hidden.float() + out.float()).to(hidden.dtype)
        return hidden + out


class Mamba2Model(nn.Module):

    def __init__(self, config: Any, vllm_config: Any, prefix: str = "backbone") -> None:
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                 prefix=f"{prefix}.embeddings")
        self.layers = nn.ModuleList([Mamba2Block(config, vllm_config, f"{prefix}.layers.{i}")
                                     for i in range(config.num_hidden_layers)])
        self.norm_f = RMSNorm(config.hidden_size, eps=float(config.layer_norm_epsilon))

    def forward(self, input_ids: Optional[torch.Tensor],
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embeddings(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return self.norm_f(hidden)


class Mamba2ForCausalLM(nn.Module):
    """A `backbone` of state-space (or hybrid) layers, a final norm and the LM head; also
    the base of the other backbone-named models (Nemotron-H: `backbone_cls`, `_rename`,
    `_stacked`)."""

    is_state_space = True
    """Has state-space layers (state slots; no prefix caching, speculative decoding or
    KV transfer for them)."""
    backbone_cls: type[nn.Module] = Mamba2Model
    _stacked: tuple[tuple[str, str, str], ...] = ()
    """(checkpoint part, fused parameter, shard id) of projections loaded into one."""

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        check_single_rank(type(self).__name__)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.backbone = self.backbone_cls(config, vllm_config)
        self.start_layer, self.end_layer = 0, config.num_hidden_layers
        attach_lm_head(self, config, "lm_head", True, True,
                       self.backbone.embeddings if self.tie_word_embeddings else None)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embeddings(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        return self.backbone(input_ids, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def _rename(self, name: str) -> str:
        """This model's name for a checkpoint tensor (older Mamba2 saves say `embedding`)."""
        return name.replace("backbone.embedding.", "backbone.embeddings.")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        drop_weight_copies(self)
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            name = self._rename(name)
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
