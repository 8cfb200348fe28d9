"""What every multi-rank executor shares: size checks, the driver rank, RPC-based calls.

A distributed executor (multiprocess or Ray) only has to say how one method call
reaches all ranks (`collective_rpc`); the engine-facing calls are built on it:

- `determine_num_available_blocks` asks every rank and keeps the minimum, since all
  ranks must agree on one block table;
- `execute_model` sends the SchedulerOutput to every rank, and only the driver (TP
  rank 0 of the last pipeline stage: the rank that samples) replies.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from vllm import envs
from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.executor.executor_base import ExecutorBase

logger = logging.getLogger(__name__)


class DistributedExecutorBase(ExecutorBase):
    """Base of the executors whose ranks live in other processes."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        verify_parallel_sizes(vllm_config)
        super().__init__(vllm_config)

    @property
    def world_size(self) -> int:
        return self.vllm_config.parallel_config.world_size

    @property
    def driver_rank(self) -> int:
        """Global rank of TP rank 0 in the last pipeline stage (rank = pp * tp_size + tp)."""
        pc = self.vllm_config.parallel_config
        return (pc.pipeline_parallel_size - 1) * pc.tensor_parallel_size

    def collective_rpc(self, method: str, args: Sequence[Any] = (),
                       unique_reply_rank: Optional[int] = None,
                       timeout: Optional[float] = None) -> list[Any]:
        """Call `worker.<method>(*args)` on every rank.

        Returns every rank's result in rank order, or only `[result]` of
        `unique_reply_rank` when given (the other ranks then answer only if they fail).
        Raises RuntimeError when a rank fails, dies, or `timeout` seconds pass.
        """
        raise NotImplementedError

    def get_compile_stats(self) -> Optional[dict]:
        return self.collective_rpc("get_compile_stats", unique_reply_rank=self.driver_rank)[0]

    def finalize_calibration(self) -> list[Optional[str]]:
        return self.collective_rpc("finalize_calibration")

    def reload_quant_scales(self, dump_stats_path: Optional[str] = None) -> int:
        return min(self.collective_rpc("reload_quant_scales", (dump_stats_path,)))

    def determine_num_available_blocks(self) -> int:
        blocks = self.collective_rpc("determine_num_available_blocks")
        logger.debug("KV blocks per rank: %s", blocks)
        return min(blocks)

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_blocks,))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (scheduler_output,),
                                   unique_reply_rank=self.driver_rank,
                                   timeout=envs.VLLM_ENGINE_ITERATION_TIMEOUT_S)[0]


def verify_parallel_sizes(vllm_config: VllmConfig) -> None:
    """Reject TP/PP sizes the model cannot be split by, before any process starts.

    The layers would fail the same way, but only inside a worker after the process
    group is up; checking here names the flag and the sizes that would work.
    """
    pc = vllm_config.parallel_config
    hf = vllm_config.model_config.hf_config
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
    heads = hf_config.num_attention_heads
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


def _tp_constraints(hf_config: Any) -> str:
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    parts = [f"num_attention_heads={heads}", f"num_key_value_heads={kv_heads}"]
    inter = getattr(hf_config, "intermediate_size", None)
    if inter is not None:
        parts.append(f"intermediate_size={inter}")
    return ", ".join(parts)
