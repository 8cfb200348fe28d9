"""The HPU worker: device setup, the memory budget, KV cache, warmup, compile stats.

Memory, after the weights are loaded and a profile run at the largest prompt
bucket has touched its peak activations:

    usable    = free * gpu_memory_utilization
    graphs    = what every bucket's graph takes by the memory model measured on
                probe graphs (graph_memory.py), at most half of usable; or
                usable * VLLM_GRAPH_RESERVED_MEM when that is set by hand
                (0 unless HPU graphs are used)
    KV cache  = usable - graphs

`num_gpu_blocks_override` or `kv_cache_memory_bytes` replace the automatic KV size.
One block of the cache is the pad block, so the cache holds num_blocks + 1 blocks.
On the fake HPU the automatic size is also capped at what `max_num_seqs`
sequences of `max_model_len` tokens can use: the fake device's memory is the
host's, and VLLM_FAKE_HPU_MEMORY_GB defaults to 16 GiB.
"""
from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from vllm import envs

from vllm.hpu import habana
from vllm.hpu.model_runner import HPUModelRunner
from vllm.hpu.log import MemorySnapshot, format_bytes, log_took
from vllm.hpu.warmup import graph_reserved_fraction
from vllm.worker.worker_base import WorkerBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HPUMemoryBudget:
    free: int
    usable: int
    graph_reserved: int
    kv_cache: int
    margin: int
    """free - usable: what gpu_memory_utilization keeps untouched."""

    @classmethod
    def plan(cls, free: int, gpu_memory_utilization: float,
             graph_reserved_mem: float, graph_bytes: Optional[int] = None
             ) -> "HPUMemoryBudget":
        """`graph_bytes` (measured) replaces the `graph_reserved_mem` share when given."""
        usable = usable_bytes(free, gpu_memory_utilization)
        if graph_bytes is not None:
            kv_cache = usable - min(usable, max(0, graph_bytes))
        else:
            if not 0 <= graph_reserved_mem < 1:
                raise ValueError(f"VLLM_GRAPH_RESERVED_MEM must be in [0, 1), got "
                                 f"{graph_reserved_mem}.")
            kv_cache = int(usable * (1 - graph_reserved_mem))
        return cls(free=free, usable=usable, graph_reserved=usable - kv_cache,
                   kv_cache=kv_cache, margin=free - usable)


def usable_bytes(free: int, gpu_memory_utilization: float) -> int:
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                         f"{gpu_memory_utilization}.")
    return int(free * gpu_memory_utilization)


def before_collective() -> Optional[Callable[[], None]]:
    """`mark_step` in lazy mode (the bridge's `is_lazy()` decides): a collective must
    see materialized tensors, not a pending lazy graph. None in eager/compile mode."""
    return habana.mark_step if habana.is_lazy() else None


class HPUWorker(WorkerBase):

    def init_device(self) -> None:
        """Take this rank's module, then join the process groups.

        One module per process: `set_device` picks it by index (see `_select_device`),
        and tensors go to `torch.device("hpu")` without an index, which then means
        that module (as in Gaudi's own vLLM backends).
        """
        self.selected_device = self._select_device()
        if habana.is_fake_hpu():
            self._share_host_cores()
        if not habana.is_fake_hpu() and self.vllm_config.parallel_config.world_size > 1:
            importlib.import_module("habana_frameworks.torch.distributed.hccl")  # registers hccl
        self.init_distributed("gloo" if habana.is_fake_hpu() else "hccl",
                              before_collective=before_collective())
        from vllm.platforms import current_platform
        current_platform.seed_everything(self.vllm_config.model_config.seed)
        current_platform.prepare_kernels()  # bind Gaudi's kernels (vllm/hpu/ops.py)
        self.model_runner = HPUModelRunner(self.vllm_config,
                                           device=torch.device(habana.torch_device_type()))
        self.model_runner.device_label = f"hpu:{self.selected_device}"
        self.memory_budget: Optional[HPUMemoryBudget] = None

    def _share_host_cores(self) -> None:
        """Fake HPU: the "devices" are the host's cores, shared by every rank of every
        data-parallel replica, so each rank takes its share as torch threads, as CPU
        ranks do (one rank keeps what it has), instead of the engine process's count.

        Inheriting that count hung forked ranks: once the engine has run OpenMP work
        with 2 threads, a forked child waits forever in its first parallel region
        (GNU OpenMP's thread pool does not survive fork). With one thread per rank
        (the share on small hosts) no pool is used; with larger shares, start the
        workers with spawn if the engine process already ran torch work."""
        pc = self.vllm_config.parallel_config
        ranks = pc.world_size * pc.data_parallel_local_size
        if ranks > 1:
            cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1)
            torch.set_num_threads(max(1, cores // ranks))

    def _select_device(self) -> int:
        """`device_index` (local rank, after the earlier data-parallel replicas' devices),
        or 0 when the runtime shows this process a single module: Ray's HPU resource
        gives each actor its own module through HABANA_VISIBLE_MODULES."""
        index, count = self.device_index, habana.device_count()
        if index >= count == 1:
            logger.info("Rank %d: one visible HPU module (HABANA_VISIBLE_MODULES); using it "
                        "instead of index %d.", self.rank, index)
            index = 0
        elif index >= count:
            raise ValueError(f"rank {self.rank} needs HPU module {index} (data_parallel_rank x "
                             f"world_size + local rank) but {count} are visible; lower "
                             "tensor_parallel_size x pipeline_parallel_size x "
                             "data_parallel_size.")
        habana.set_device(index)
        return index

    def get_device_index(self) -> int:
        """The module the HPU runtime (or the fake HPU) says this process works on."""
        return habana.current_device()

    def determine_num_available_blocks(self) -> int:
        """KV blocks (pad block excluded) from the memory budget (see module doc)."""
        runner: HPUModelRunner = self.model_runner
        cc = self.vllm_config.cache_config
        runner.profile_run()
        budget, source = self._plan_budget(runner, cc.gpu_memory_utilization)
        self.memory_budget = budget
        runner.mem_margin = budget.margin
        logger.info("Free device memory: %s, %s usable (gpu_memory_utilization=%s), %s "
                    "reserved for HPUGraphs (%s), %s reserved for KV cache",
                    format_bytes(budget.free), format_bytes(budget.usable),
                    cc.gpu_memory_utilization, format_bytes(budget.graph_reserved), source,
                    format_bytes(budget.kv_cache))
        num_blocks, source = self._kv_blocks(budget.kv_cache, log_cap=True)
        logger.info("KV cache: %d blocks of %s (+1 pad block) from %s.", num_blocks,
                    format_bytes(runner.get_kv_cache_block_bytes()), source)
        return num_blocks

    def _kv_blocks(self, kv_bytes: int, log_cap: bool = False) -> tuple[int, str]:
        """KV blocks for `kv_bytes` of budget, unless the user chose them."""
        cc = self.vllm_config.cache_config
        block_bytes = self.model_runner.get_kv_cache_block_bytes()
        if cc.num_gpu_blocks_override is not None:
            return max(1, cc.num_gpu_blocks_override), "num_gpu_blocks_override"
        if cc.kv_cache_memory_bytes is not None:
            return max(1, cc.kv_cache_memory_bytes // block_bytes - 1), "kv_cache_memory_bytes"
        return max(1, self._fake_cap(kv_bytes // block_bytes - 1, log_cap)), "memory budget"

    def _max_kv_blocks(self, usable: int) -> int:
        """The most blocks the cache can get (all usable memory, or the user's choice):
        the decode buckets whose graphs the reserve must hold are at most these."""
        return self._kv_blocks(usable)[0]

    def _plan_budget(self, runner: HPUModelRunner, utilization: float
                     ) -> tuple[HPUMemoryBudget, str]:
        """The budget, and what set the graph reserve (for the log line)."""
        reserved = graph_reserved_fraction()
        if not runner.uses_hpu_graphs:
            return HPUMemoryBudget.plan(habana.mem_get_info()[0], utilization, 0.0), \
                "VLLM_GRAPH_RESERVED_MEM=0.0"
        if reserved is not None:
            return HPUMemoryBudget.plan(habana.mem_get_info()[0], utilization, reserved), \
                f"VLLM_GRAPH_RESERVED_MEM={reserved}"
        free = habana.mem_get_info()[0]
        usable = usable_bytes(free, utilization)
        plan = runner.measure_graph_memory(usable, self._max_kv_blocks(usable))
        free = habana.mem_get_info()[0]  # the probe graphs are gone again
        return (HPUMemoryBudget.plan(free, utilization, 0.0, graph_bytes=plan.reserve),
                f"measured: {plan.reserve / max(1, usable_bytes(free, utilization)):.4f} "
                f"of usable{', capped' if plan.capped else ''}")

    def _fake_cap(self, num_blocks: int, log: bool = True) -> int:
        if not habana.is_fake_hpu():
            return num_blocks
        sc = self.vllm_config.scheduler_config
        bs = self.vllm_config.cache_config.block_size
        cap = sc.max_num_seqs * -(-self.vllm_config.model_config.max_model_len // bs)
        if num_blocks > cap:
            if log:
                logger.info("Fake HPU: KV cache capped at %d blocks (max_num_seqs=%d sequences "
                            "of max_model_len tokens); set kv_cache_memory_bytes or "
                            "num_gpu_blocks_override to choose.", cap, sc.max_num_seqs)
            return cap
        return num_blocks

    def initialize_cache(self, num_blocks: int) -> None:
        """The KV cache, then the warmup; the seed's `init_cache_engine took` line
        covers both (what serving starts with)."""
        runner: HPUModelRunner = self.model_runner
        before = MemorySnapshot.take()
        runner.initialize_kv_cache(num_blocks)
        runner.init_kv_connector()
        if envs.VLLM_SKIP_WARMUP:
            runner.skip_warmup()
        else:
            runner.warmup_model()
        log_took("init_cache_engine", before)

    def get_compile_stats(self) -> dict:
        """Compile accounting for metrics (see HPUModelRunner.get_compile_stats)."""
        return self.model_runner.get_compile_stats()

    def get_bucket_stats(self) -> dict:
        """Padding and bucket accounting (see HPUModelRunner.get_bucket_stats)."""
        return self.model_runner.get_bucket_stats()

    def shutdown(self) -> None:
        super().shutdown()
        if self.model_runner is not None:
            self.model_runner.release_graphs()
            path = self.model_runner.profiler.flush()
            if path:
                logger.info("HPU trace written to %s", path)
