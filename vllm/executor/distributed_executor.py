"""What every multi-rank executor shares: size checks before any process starts.

A distributed executor (multiprocess or Ray) only has to say how one call reaches all
ranks (`collective_rpc`, with vLLM's signature); the engine-facing calls are built on
it in ExecutorBase:

- `determine_num_available_blocks` asks every rank and keeps the minimum, since all
  ranks must agree on one block table;
- `execute_model` sends the SchedulerOutput to every rank, and only the driver (TP
  rank 0 of the last pipeline stage: the rank that samples) replies.

A callable `method` travels to the workers pickled by value (cloudpickle), so a
lambda or a function defined in a test or a notebook works, as in vLLM.
"""
from __future__ import annotations

import logging
from typing import Any

import cloudpickle

from vllm.config import VllmConfig
from vllm.executor.executor_base import ExecutorBase, WorkerMethod

logger = logging.getLogger(__name__)


class DistributedExecutorBase(ExecutorBase):
    """Base of the executors whose ranks live in other processes."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        verify_parallel_sizes(vllm_config)
        super().__init__(vllm_config)


def wire_method(method: WorkerMethod) -> Any:
    """`method` as it crosses a process boundary: a name as is, a callable as bytes."""
    return method if isinstance(method, str) else cloudpickle.dumps(method)


def unwire_method(method: Any) -> WorkerMethod:
    return cloudpickle.loads(method) if isinstance(method, bytes) else method


def method_name(method: Any) -> str:
    """How a method is named in error messages."""
    if isinstance(method, str):
        return method
    return getattr(method, "__qualname__", None) or "a function"


def verify_parallel_sizes(vllm_config: VllmConfig) -> None:
    """Reject TP/PP sizes the model cannot be split by, before any process starts.

    The layers would fail the same way, but only inside a worker after the process
    group is up; checking here names the flag and the sizes that would work.
    """
    pc = vllm_config.parallel_config
    hf = vllm_config.model_config.hf_config
    # Multimodal configs nest the language model's sizes (what TP/PP split) in text_config.
    hf = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    tp, pp = pc.tensor_parallel_size, pc.pipeline_parallel_size
    if tp > 1:
        valid = valid_tensor_parallel_sizes(hf)
        if tp not in valid:
            raise ValueError(
                f"tensor_parallel_size={tp} does not split this model evenly "
                f"({_tp_constraints(hf)}); valid sizes: {', '.join(map(str, valid))}.")
    layers = hf.num_hidden_layers
    if pp > layers:
        raise ValueError(f"pipeline_parallel_size={pp} is larger than the model's "
                         f"num_hidden_layers ({layers}); allowed range: 1..{layers}.")


def valid_tensor_parallel_sizes(hf_config: Any) -> list[int]:
    """TP sizes that divide the query heads and the MLP width, and fit the KV heads.

    KV heads are either split (tp divides them) or replicated (tp is a multiple of
    them), as the QKV projection layer supports.
    """
    heads = _heads_of(hf_config)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    inter = getattr(hf_config, "intermediate_size", None)
    sizes = []
    for tp in range(1, heads + 1):
        if heads % tp or (inter is not None and inter % tp):
            continue
        if (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
            continue
        sizes.append(tp)
    return sizes


def _heads_of(hf_config: Any) -> int:
    """Query heads; an attention-free model's (Mamba2's) SSM heads, which TP splits."""
    return getattr(hf_config, "num_attention_heads", None) or hf_config.num_heads


def _tp_constraints(hf_config: Any) -> str:
    heads = _heads_of(hf_config)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    parts = [f"num_attention_heads={heads}", f"num_key_value_heads={kv_heads}"]
    inter = getattr(hf_config, "intermediate_size", None)
    if inter is not None:
        parts.append(f"intermediate_size={inter}")
    return ", ".join(parts)
