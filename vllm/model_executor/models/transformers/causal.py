"""`TransformersForCausalLM`: any decoder-only `transformers` causal LM on our engine.

The library's own modules run the model (embedding scale, rotary, norms, MLPs, the
block structure); ours replace what the engine must own: the linear layers (kernels,
sharding), the vocab-parallel embedding and LM head, the logits processor (the sampler
path reads it), and attention, which reaches our paged `Attention` layers through the
interface (attention.py). Parameter names are the checkpoint's: the base model sits at
the attribute its class names (`base_model_prefix`), the head at `lm_head`.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.transformers.attention import (ATTN_IMPLEMENTATION,
                                                               build_attention_instances,
                                                               register_attention)
from vllm.model_executor.models.transformers.modules import (materialize_meta,
                                                             params_on_meta, replace_layers)
from vllm.model_executor.models.transformers.moe import expert_weights, replace_experts
from vllm.model_executor.models.transformers.pipeline import split_stages
from vllm.model_executor.models.transformers.support import resolve_transformers_class
from vllm.model_executor.models.utils import PPMissingLayer, check_loaded, default_weight_loader
from vllm.sequence import IntermediateTensors

logger = logging.getLogger(__name__)


def _head_layout(config: Any, plan: dict[str, str],
                 tp_size: int) -> tuple[int, int, int, bool]:
    """(query heads, KV heads, head size) of this rank and whether attention is sharded:
    heads split only where the plan shards the q projection column-wise and both head
    counts divide by the TP size; otherwise (models whose q/k norms need every head, MQA
    over more ranks than KV heads) every rank runs all of attention."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    shard = (tp_size > 1 and plan.get("layers.*.self_attn.q_proj") == "colwise"
             and heads % tp_size == 0 and kv_heads % tp_size == 0)
    if shard:
        heads, kv_heads = heads // tp_size, kv_heads // tp_size
    return heads, kv_heads, head_dim, shard


class TransformersForCausalLM(nn.Module):
    """A `transformers` causal LM with our linear layers, attention and LM head."""

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        model_config = vllm_config.model_config
        config = model_config.hf_config
        hf_cls = resolve_transformers_class(config)
        hf_model = build_on_meta(hf_cls, config, model_config.torch_dtype,
                                 ATTN_IMPLEMENTATION)
        self.config = hf_model.config
        self.base_model_prefix = hf_model.base_model_prefix
        setattr(self, self.base_model_prefix, hf_model.base_model)
        self._adopt_language_model(hf_model, self.base_model_prefix, self.config)
        materialize_meta(self, torch.get_default_device())
        logger.info("Transformers modeling backend: %s (attention through our paged "
                    "attention, tp_size=%d).", hf_cls.__name__,
                    get_tensor_model_parallel_world_size())

    def _adopt_language_model(self, hf_model: nn.Module, base_path: str,
                              text_config: Any) -> None:
        """Make the decoder at `base_path` of `self` (the library's base model of the
        text model) ours: its linears and embedding replaced per the tp plan, its
        experts by the fused MoE op, this pipeline stage's layers kept, one paged
        `Attention` per layer, our LM head in place of `hf_model`'s."""
        self.lm_base_path = base_path
        base = self.get_base()
        tp_size = get_tensor_model_parallel_world_size()
        plan = dict(getattr(text_config, "base_model_tp_plan", None) or {})
        heads, kv_heads, head_dim, shard = _head_layout(text_config, plan, tp_size)
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        # Global indices of this stage's decoder layers (the runner sizes KV caches by them).
        self.start_layer, self.end_layer = split_stages(base, text_config, pp.rank_in_group,
                                                        pp.world_size)
        replace_layers(base, plan, tp_size, base_path, shard)
        self.num_moe_blocks = replace_experts(base, text_config, base_path)
        self._renames = checkpoint_renames(hf_model.config)
        self.attn_layers = build_attention_instances(base, text_config, heads, kv_heads,
                                                     head_dim, "attn_layers",
                                                     range(self.start_layer, self.end_layer))
        self._attention_by_index = {int(i): layer for i, layer in self.attn_layers.items()}
        # transformers ties by the top config (a multimodal model's, not its text one's)
        self.tie_word_embeddings = bool(getattr(hf_model.config, "tie_word_embeddings",
                                                False))
        self._build_lm_head(hf_model, text_config)

    def _build_lm_head(self, hf_model: nn.Module, config: Any) -> None:
        if not self.is_last_stage:
            self.lm_head = PPMissingLayer()
            return
        head = hf_model.get_output_embeddings()
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      bias=getattr(head, "bias", None) is not None,
                                      prefix="lm_head")
        embed = self.get_base().get_input_embeddings()
        if self.tie_word_embeddings and self.is_first_stage:
            self.lm_head.tie_weights(embed)
        scale = float(getattr(config, "logit_scale", None) or 1.0)  # Cohere
        self.logits_processor = LogitsProcessor(
            config.vocab_size, scale=scale,
            soft_cap=getattr(config, "final_logit_softcapping", None))

    def get_base(self) -> nn.Module:
        """The text model's decoder (the library's base model of the language model)."""
        return self.get_submodule(self.lm_base_path)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        """[T] token ids (or [T, hidden] embeddings) -> [T, hidden] on the last pipeline
        stage, else IntermediateTensors: the step's tokens as one batch row; attention
        keeps the sequences apart."""
        if not self.is_first_stage:
            if intermediate_tensors is None:
                raise ValueError("a later pipeline stage needs intermediate_tensors.")
            inputs_embeds = intermediate_tensors["hidden_states"]
        out = self.get_base()(
            input_ids=input_ids[None] if inputs_embeds is None else None,
            inputs_embeds=inputs_embeds[None] if inputs_embeds is not None else None,
            position_ids=positions[None], use_cache=False, return_dict=True,
            attention_instances=self._attention_by_index)
        hidden = out.last_hidden_state[0]
        if not self.is_last_stage:
            return IntermediateTensors({"hidden_states": hidden})
        return hidden

    def make_empty_intermediate_tensors(self, batch_size: int, dtype: torch.dtype,
                                        device: Union[str, torch.device]) -> IntermediateTensors:
        """Buffers a later PP stage receives into (shape [batch_size, hidden])."""
        return IntermediateTensors({"hidden_states": torch.zeros(
            (batch_size, self.get_base().config.hidden_size), dtype=dtype,
            device=device)})

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab_size], the full vocabulary on every TP rank."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (the library's names) into our parameters, each
        through its layer's weight loader (which takes this rank's shard)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (self.tie_word_embeddings
                                                 and name.startswith("lm_head.")):
                continue
            name = self._rename(name)
            experts = expert_weights(name, tensor)
            if experts is not None:
                for target, part, shard, expert in experts:
                    if target not in params:
                        ignored.append(name)
                        break
                    params[target].weight_loader(params[target], part, shard, expert)
                    loaded.add(target)
                continue
            param = params.get(name)
            if param is None:
                if not self._on_other_stage(name):
                    ignored.append(name)
                continue
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        if self.tie_word_embeddings and "lm_head.weight" in params:
            loaded.add("lm_head.weight")
        return check_loaded(params, loaded, ignored)

    def _on_other_stage(self, name: str) -> bool:
        """A tensor of a module this pipeline stage does not hold."""
        base = f"{self.lm_base_path}."
        m = re.match(rf"{re.escape(base)}layers\.(\d+)\.", name)
        if m:
            return not self.start_layer <= int(m.group(1)) < self.end_layer
        if name.startswith(f"{base}embed_tokens."):
            return not self.is_first_stage
        if name.startswith((f"{base}norm.", "lm_head.")):
            return not self.is_last_stage
        return False

    def _rename(self, name: str) -> str:
        """The library's name for a checkpoint tensor (its renames on load, e.g.
        Mixtral's `block_sparse_moe` -> `mlp`)."""
        for rename in self._renames:
            name, _ = rename.rename_source_key(name)
        return name


def build_on_meta(hf_cls: type, config: Any, dtype: torch.dtype,
                  attn_implementation: Any) -> nn.Module:
    """The library's model of `hf_cls` for `config`, its parameters on the meta device,
    attention through `attn_implementation` (the backend's name, or a dict of one name
    per sub-config for a model whose parts attend differently)."""
    register_attention()
    with params_on_meta():
        return hf_cls._from_config(config, dtype=dtype,
                                   attn_implementation=attn_implementation)


def checkpoint_renames(config: Any) -> list[Any]:
    """transformers' plain key renames for this model type (its checkpoint conversion
    mapping, without the tensor conversions: expert stacking is ours, moe.py)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:
        return []
    mapping = get_checkpoint_conversion_mapping(getattr(config, "model_type", "")) or []
    return [m for m in mapping if isinstance(m, WeightRenaming)]
