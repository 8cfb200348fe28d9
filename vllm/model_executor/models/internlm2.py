"""InternLM2 / InternLM2.5: the Llama decoder under InternLM2's own tensor names.

transformers does not ship this family (its repositories carry it as remote code);
the config is vllm/transformers_utils/configs/internlm2.py and the weights map onto the
Llama modules:

    tok_embeddings -> embed_tokens        output -> lm_head
    attention.wqkv -> self_attn.qkv_proj  attention.wo -> self_attn.o_proj
    feed_forward.w1 / w3 / w2 -> mlp gate / up / down
    attention_norm -> input_layernorm     ffn_norm -> post_attention_layernorm

`wqkv` is packed per KV group: for each KV head, the rows of its
`heads / kv_heads` query heads, then its key, then its value (`[kv_heads, groups + 2,
head_dim, hidden]`), unpacked here into q, k and v. `bias` (config) puts biases on
wqkv and wo.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from vllm.model_executor.models.gpt_base import split_per_head
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaModel)
from vllm.model_executor.models.utils import head_dim_of

_RENAMES = (("model.tok_embeddings.", "model.embed_tokens."), ("output.", "lm_head."),
            (".attention.wo.", ".self_attn.o_proj."),
            (".feed_forward.w1.", ".mlp.gate_proj."), (".feed_forward.w3.", ".mlp.up_proj."),
            (".feed_forward.w2.", ".mlp.down_proj."),
            (".attention_norm.", ".input_layernorm."),
            (".ffn_norm.", ".post_attention_layernorm."))


class InternLM2Attention(LlamaAttention):

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        bias = bool(getattr(config, "bias", False))
        return bias, bias


class InternLM2DecoderLayer(LlamaDecoderLayer):
    attention_cls = InternLM2Attention


class InternLM2Model(LlamaModel):
    layer_cls = InternLM2DecoderLayer


class InternLM2ForCausalLM(LlamaForCausalLM):
    model_cls = InternLM2Model

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._as_llama(weights))

    def _as_llama(self, weights: Iterable[tuple[str, torch.Tensor]]
                  ) -> Iterator[tuple[str, torch.Tensor]]:
        """InternLM2's tensor names (and packed wqkv) as Llama's."""
        cfg = self.config
        heads = cfg.num_attention_heads
        split = split_per_head(heads, getattr(cfg, "num_key_value_heads", None) or heads,
                               head_dim_of(cfg))
        for name, tensor in weights:
            if ".attention.wqkv." in name:
                for part, t in zip(("q_proj", "k_proj", "v_proj"), split(tensor)):
                    yield name.replace(".attention.wqkv.", f".self_attn.{part}."), t
                continue
            for old, new in _RENAMES:
                if name.startswith(old) if old.endswith(".") and not old.startswith(".") \
                        else old in name:
                    name = name.replace(old, new, 1)
                    break
            yield name, tensor
