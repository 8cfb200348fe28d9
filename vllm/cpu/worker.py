"""The CPU worker: threads, KV cache sized from VLLM_CPU_KVCACHE_SPACE, the CPU runner."""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from vllm import envs
from vllm.cpu.model_runner import CPUModelRunner
from vllm.worker.worker_base import WorkerBase

logger = logging.getLogger(__name__)

_GiB = 1 << 30
_DEFAULT_KV_SPACE_GiB = 4.0


class CPUWorker(WorkerBase):

    def init_device(self) -> None:
        self._set_threads()
        self.init_distributed("gloo")
        from vllm.platforms import current_platform
        current_platform.seed_everything(self.vllm_config.model_config.seed)
        current_platform.prepare_kernels()  # bind (and build) the kernels
        self.model_runner = CPUModelRunner(self.vllm_config, device="cpu")

    def _set_threads(self) -> None:
        """Bind this rank to its cores (VLLM_CPU_OMP_THREADS_BIND) and size its thread pool.

        Data-parallel replicas run on the same machine too, so they share the cores.
        """
        pc = self.vllm_config.parallel_config
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            list(range(os.cpu_count() or 1))
        # This node's ranks (all of them unless --nnodes spreads them over nodes).
        cores = cores_for_rank(envs.VLLM_CPU_OMP_THREADS_BIND, allowed,
                               self.rank % pc.ranks_per_node,
                               pc.ranks_per_node, pc.data_parallel_local_size)
        if cores is not None:
            os.sched_setaffinity(0, cores)
            logger.info("Rank %d bound to cores %s.", self.rank, _format_cores(cores))
            torch.set_num_threads(len(cores))
            return
        world = pc.ranks_per_node * pc.data_parallel_local_size
        torch.set_num_threads(max(1, len(allowed) // world))

    def determine_num_available_blocks(self) -> int:
        cc = self.vllm_config.cache_config
        block_bytes = self.model_runner.get_kv_cache_block_bytes()
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        return max(1, self._kv_cache_bytes(block_bytes) // block_bytes)

    def _kv_cache_bytes(self, block_bytes: int) -> int:
        """kv_cache_memory_bytes, else VLLM_CPU_KVCACHE_SPACE GiB, else an automatic size.

        Automatic: 4 GiB (vLLM's historical CPU default), but never more than what
        max_num_seqs full-length sequences could use, nor half the available memory.
        """
        cc = self.vllm_config.cache_config
        if cc.kv_cache_memory_bytes is not None:
            return cc.kv_cache_memory_bytes
        space = envs.VLLM_CPU_KVCACHE_SPACE
        if space > 0:
            return int(space * _GiB)
        from vllm.platforms import current_platform
        available, _ = current_platform.mem_get_info()
        sc = self.vllm_config.scheduler_config
        bs = cc.block_size
        pc = self.vllm_config.parallel_config
        world = pc.ranks_per_node * pc.data_parallel_local_size
        needed = sc.max_num_seqs * -(-sc.max_model_len // bs) * block_bytes
        return int(min(_DEFAULT_KV_SPACE_GiB * _GiB, needed, available / 2 / world))


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpu-list syntax)."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND: bad core list {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND: bad range {part!r}")
        cores.extend(range(first, last + 1))
    if not cores:
        raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND: empty core list {text!r}")
    return sorted(set(cores))


def cores_for_rank(spec: str, allowed: list[int], rank: int, world_size: int,
                   data_parallel_size: int = 1) -> Optional[list[int]]:
    """The cores rank `rank` binds to, or None to stay unbound.

    - `auto`: with several ranks (and one replica), rank r takes the r-th equal share of
      the allowed cores, so the ranks do not contend for cores; one rank stays unbound.
    - `all` / `nobind`: no binding; the ranks split the thread count.
    - `0-3|4-7`: an explicit core list per rank, separated by `|`.
    """
    spec = spec.strip().lower()
    if spec in ("all", "nobind"):
        return None
    if spec == "auto":
        if world_size == 1 or data_parallel_size > 1 or len(allowed) < world_size:
            return None
        share = len(allowed) // world_size
        return allowed[rank * share:(rank + 1) * share]
    lists = spec.split("|")
    if len(lists) != world_size:
        raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND={spec!r} gives {len(lists)} core lists "
                         f"for {world_size} ranks; give one per rank, separated by '|'.")
    cores = parse_cpu_list(lists[rank])
    missing = sorted(set(cores) - set(allowed))
    if missing:
        raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND: cores {missing} are not available to "
                         f"this process (allowed: {_format_cores(allowed)}).")
    return cores


def _format_cores(cores: list[int]) -> str:
    return ",".join(map(str, cores))
