"""Qwen3-MoE: Qwen3 attention (per-head q/k RMSNorm) with routed experts, no shared
expert; top-k weights renormalized when `norm_topk_prob` (true in released configs)."""
from __future__ import annotations

from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel
from vllm.model_executor.models.mixtral import MoECausalLMMixin
from vllm.model_executor.models.qwen2_moe import Qwen2MoeDecoderLayer
from vllm.model_executor.models.qwen3 import Qwen3Attention


class Qwen3MoeDecoderLayer(Qwen2MoeDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3MoeModel(LlamaModel):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = Qwen3MoeModel
