"""Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration): Qwen3-VL (qwen3_vl.py: vision
tower, DeepStack, interleaved M-RoPE, frontend) in front of a Qwen3-MoE language model.

The language model's decoder layers are Qwen3-MoE's (routed experts, softmax top-k,
the top-k weights always renormalized as transformers' Qwen3-VL-MoE router does; the
`mlp_only_layers` / `decoder_sparse_step` layers stay dense). Checkpoints store each
layer's experts as two stacked tensors, `mlp.experts.gate_up_proj` and
`mlp.experts.down_proj`: the hub's files as [experts, hidden, 2 * inter] and
[experts, inter, hidden], transformers 5's in-memory layout transposed
([experts, 2 * inter, hidden], [experts, hidden, inter]); both load (a tensor already in
transformers 5's shape is taken as is, as transformers does), split per expert into the
gate / up / down projections the fused MoE layer loads.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Iterator

import torch

from vllm.model_executor.models.mixtral import MoECausalLMMixin
from vllm.model_executor.models.qwen3_moe import Qwen3MoeDecoderLayer
from vllm.model_executor.models.qwen3_vl import (Qwen3LLMForCausalLM, Qwen3LLMModel,
                                                 Qwen3VLForConditionalGeneration)

_STACKED_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


class Qwen3MoeLLMModel(Qwen3LLMModel):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeLLMForCausalLM(MoECausalLMMixin, Qwen3LLMForCausalLM):
    model_cls = Qwen3MoeLLMModel


def split_stacked_experts(weights: Iterable[tuple[str, torch.Tensor]], hidden: int,
                          inter: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Stacked expert tensors -> per-expert `experts.{e}.{gate,up,down}_proj.weight`
    ([out, in] each); other tensors pass through."""
    for name, tensor in weights:
        m = _STACKED_EXPERTS.match(name)
        if m is None:
            yield name, tensor
            continue
        prefix, kind = m.groups()
        if kind == "gate_up_proj":
            if tuple(tensor.shape[1:]) != (2 * inter, hidden):
                tensor = tensor.transpose(1, 2)  # hub layout [E, hidden, 2 * inter]
            for e, w in enumerate(tensor):
                yield f"{prefix}.{e}.gate_proj.weight", w[:inter]
                yield f"{prefix}.{e}.up_proj.weight", w[inter:]
        else:
            if tuple(tensor.shape[1:]) != (hidden, inter):
                tensor = tensor.transpose(1, 2)  # hub layout [E, inter, hidden]
            for e, w in enumerate(tensor):
                yield f"{prefix}.{e}.down_proj.weight", w


class Qwen3VLMoeForConditionalGeneration(Qwen3VLForConditionalGeneration):
    """Qwen3-VL with the Qwen3-MoE language model (see the module docstring)."""

    text_cls = Qwen3MoeLLMForCausalLM

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        text = vllm_config.model_config.hf_config.text_config
        if getattr(text, "norm_topk_prob", None) is None:
            text.norm_topk_prob = True  # the router always renormalizes its top-k
        super().__init__(vllm_config, prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        text = self.config.text_config
        return super().load_weights(split_stacked_experts(weights, text.hidden_size,
                                                          text.moe_intermediate_size))
