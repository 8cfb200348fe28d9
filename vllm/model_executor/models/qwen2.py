"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q, k and v projections."""
from __future__ import annotations

from typing import Any

from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaModel)


class Qwen2Attention(LlamaAttention):

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        return True, False


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2Model(LlamaModel):
    layer_cls = Qwen2DecoderLayer


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 causal LM (sliding window on the layers the config marks, see
    `sliding_window_of`)."""
    model_cls = Qwen2Model
