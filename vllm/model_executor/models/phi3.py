"""Phi-3 / Phi-4-mini: the Llama decoder with fused qkv_proj and gate_up_proj tensors in
the checkpoint (loaded as they are) and LongRoPE in long-context configs."""
from __future__ import annotations

from vllm.model_executor.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """Fused checkpoint tensors reach the merged layers with shard id None, which
    split them (QKVParallelLinear / MergedColumnParallelLinear weight loaders)."""
