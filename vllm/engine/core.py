"""The engine core: scheduler + executor, stepping requests forward one batch at a time.

It knows nothing about text: requests come in as token ids, outputs leave as token
ids, logprobs and finish reasons. Detokenization and stop strings live in the
frontend (LLMEngine), which is what lets the core run in another process later.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any, Iterable, Optional

from vllm.config import VllmConfig
from vllm.core.sched_output import SchedulerOutput
from vllm.core.scheduler import EngineCoreOutput, Scheduler, SchedulerStats
from vllm.engine.utility import get_utility
from vllm.executor.executor_base import ExecutorBase, WorkerMethod
from vllm.kv_cache_spec import KVCacheConfig, get_kv_cache_config, is_sliding
from vllm.request import Request, RequestStatus
from vllm.worker.sleep_mode import (SLEEP_TAGS, check_level2_supported, check_sleep_level,
                                    check_wake_tags)
from vllm.worker.torch_profiler import check_profiler_enabled

logger = logging.getLogger(__name__)

GRAMMAR_WAIT_S = 0.02
"""Longest an idle step waits for a grammar compile (new requests wait at most this)."""


class EngineCore:

    def __init__(self, vllm_config: VllmConfig,
                 executor_class: Optional[type[ExecutorBase]] = None) -> None:
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        start = time.perf_counter()
        self.vllm_config = vllm_config
        self.executor = (executor_class or ExecutorBase.get_class(vllm_config))(vllm_config)
        self.kv_cache_config = self._kv_cache_config()
        num_blocks = self._init_kv_cache()
        self.scheduler = Scheduler(vllm_config, num_blocks, self.kv_cache_config)
        self.loaded_loras: dict[int, Any] = {}
        """LoRARequests the workers loaded and checked, by id (see utility.py)."""
        self._sleeping_tags: set[str] = set()
        self.weight_version: Optional[str] = None
        """The label of the weights served, set by the last weight update (utility.py)."""
        self._profiling = False
        self.async_scheduling = vllm_config.scheduler_config.async_scheduling
        self._in_flight: Optional[tuple[SchedulerOutput, Future]] = None
        """Async scheduling: the step submitted and not yet collected."""
        logger.info("Engine core initialized in %.2f s", time.perf_counter() - start)

    def _kv_cache_config(self) -> Optional[KVCacheConfig]:
        """The KV cache layout of the whole model (every pipeline stage's layer specs),
        given to every worker before they size and allocate their caches. None for an
        executor without layer specs (a test double): one plain group."""
        if not hasattr(self.executor, "get_kv_cache_specs"):
            return None
        specs = self.executor.get_kv_cache_specs()
        reason = self._hybrid_disabled_reason()
        if reason is not None and any(is_sliding(s) for s in specs.values()):
            logger.info("Sliding-window layers keep a full-length KV cache: %s.", reason)
        config = get_kv_cache_config(specs, hybrid=reason is None)
        logger.info("KV cache layout: %s.", config.describe())
        self._refuse_state_layers_with(config)
        self.executor.set_kv_cache_config(config)
        return config

    def _refuse_state_layers_with(self, config: KVCacheConfig) -> None:
        """State-space layers (one state per request, advanced by every computed token)
        cannot take back rejected draft tokens, nor be moved between engines as KV."""
        if not config.state_specs:
            return
        arch = ", ".join(getattr(self.vllm_config.model_config, "architectures", None) or [])
        if getattr(self.vllm_config, "speculative_config", None) is not None:
            raise ValueError(f"Speculative decoding is not supported for models with "
                             f"state-space layers ({arch}): their per-request state cannot "
                             "be rolled back past rejected draft tokens.")
        if getattr(self.vllm_config.cache_config, "kv_offloading_size", None) is not None:
            raise ValueError(f"kv_offloading_size: KV offloading is not supported for models "
                             f"with state-space layers (MambaSpec; {arch}): it moves KV "
                             "blocks, not per-request states.")
        if getattr(self.vllm_config, "kv_transfer_config", None) is not None:
            raise ValueError(f"KV transfer (prefill/decode disaggregation) is not supported "
                             f"for models with state-space layers ({arch}): connectors move "
                             "KV blocks, not per-request states.")

    def _hybrid_disabled_reason(self) -> Optional[str]:
        """Why sliding-window layers may not keep only their window, or None."""
        cfg = self.vllm_config
        if cfg.scheduler_config.disable_hybrid_kv_cache_manager:
            return "--disable-hybrid-kv-cache-manager"
        if getattr(cfg, "kv_transfer_config", None) is not None:
            return "KV connectors move one block table per request"
        if getattr(cfg, "speculative_config", None) is not None:
            return "speculative decoding reads one block table per request"
        if not self.executor.supports_hybrid_kv_cache():
            return "this platform's runner builds one block table per request"
        return None

    def _init_kv_cache(self) -> int:
        cfg = self.vllm_config
        num_blocks = self.executor.determine_num_available_blocks()
        bs = cfg.cache_config.block_size
        max_len = cfg.model_config.max_model_len
        if self.kv_cache_config is not None and self.kv_cache_config.is_hybrid:
            self._check_hybrid_fits(num_blocks)
        elif num_blocks * bs < max_len:
            raise ValueError(
                f"The model's max seq len ({max_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({num_blocks * bs}). Increase the KV "
                "cache size (VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes / "
                "gpu_memory_utilization) or decrease max_model_len.")
        cfg.cache_config.num_gpu_blocks = num_blocks
        # vLLM's wording ("# GPU blocks: N, # CPU blocks: M", the CPU backend's
        # "# CPU blocks: N"); no swap space here, so an accelerator has 0 CPU blocks.
        # Logged once the size is known, before the cache is built and warmed up (the
        # HPU seed's moment: warmup logs follow it).
        device = cfg.device_config.device.upper()
        tail = f" (block size {bs}, {num_blocks * bs} tokens)"
        if device == "CPU":
            logger.info("# CPU blocks: %d%s", num_blocks, tail)
        else:
            logger.info("# %s blocks: %d, # CPU blocks: 0%s", device, num_blocks, tail)
        logger.info("Maximum concurrency for %d tokens per request: %.2fx", max_len,
                    num_blocks * bs / max_len)
        self._cap_running_to_state_slots(num_blocks)
        self.executor.initialize_cache(num_blocks)
        return num_blocks

    def _cap_running_to_state_slots(self, num_blocks: int) -> None:
        """A model with state-space layers runs at most as many requests as the budget
        holds states for (one slot each, charged to the blocks): max_num_seqs is capped
        to it before the scheduler and the runners' state caches are built."""
        config = self.kv_cache_config
        if config is None or not config.state_specs:
            return
        sc = self.vllm_config.scheduler_config
        slots = config.state_slots(num_blocks, self.vllm_config.model_config.max_model_len,
                                   self.vllm_config.cache_config.block_size, sc.max_num_seqs)
        if slots < sc.max_num_seqs:
            logger.info("max_num_seqs lowered from %d to %d: the KV cache budget holds the "
                        "states (%d bytes each) of %d requests.", sc.max_num_seqs, slots,
                        config.state_bytes_per_request(), slots)
            sc.max_num_seqs = slots

    def _check_hybrid_fits(self, num_blocks: int) -> None:
        """One request of max_model_len tokens must fit: full-attention groups hold all
        its blocks, sliding-window groups their window plus a step's tokens."""
        cfg = self.vllm_config
        max_len = cfg.model_config.max_model_len
        needed = 1 + self.kv_cache_config.max_blocks_per_request(  # 1: the null block
            max_len, cfg.scheduler_config.max_num_batched_tokens)
        if num_blocks < needed:
            raise ValueError(
                f"The model's max seq len ({max_len}) needs {needed} KV cache blocks "
                f"({self.kv_cache_config.describe()}), more than the {num_blocks} the KV "
                "cache holds. Increase the KV cache size (VLLM_CPU_KVCACHE_SPACE / "
                "kv_cache_memory_bytes / gpu_memory_utilization) or decrease max_model_len.")

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: Iterable[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.scheduler.finish_requests(request_ids, status)
        self._flush_finished()

    def _flush_finished(self) -> None:
        """When no request is left to run, tell the workers at once which requests
        finished (an empty step): no later step may come to carry the ids, and the
        workers would keep those requests' states."""
        if (self.scheduler.has_finished_requests()
                and not self.scheduler.has_unfinished_requests()):
            self.executor.execute_model(self.scheduler.schedule())

    def step(self) -> list[EngineCoreOutput]:
        """Schedule and run one batch (async scheduling: see `_step_async`).

        A step that schedules no token still goes to the workers when requests
        finished since the last one: that is how the workers learn to drop their
        state for them (see also `_flush_finished`).
        """
        if self.async_scheduling:
            return self._step_async()
        if not self.scheduler.has_requests():
            return []
        scheduler_output = self.scheduler.schedule()
        failed = self.scheduler.take_failed_outputs()
        if scheduler_output.is_empty:
            if scheduler_output.finished_req_ids:
                self.executor.execute_model(scheduler_output)  # workers drop their states
            elif not failed:
                # Only requests whose grammars are compiling: wait for one, not spin.
                self.scheduler.wait_for_grammars(GRAMMAR_WAIT_S)
            return failed
        runner_output = self.executor.execute_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self._flush_finished()
        return failed + outputs

    def _step_async(self) -> list[EngineCoreOutput]:
        """Schedule step N+1 while step N runs, then collect step N's tokens.

        The scheduler books a step's progress when it schedules it (the tokens it will
        sample are placeholders that the worker, which samples them, feeds as the next
        inputs), so the next schedule does not wait for them. It must wait when the next
        schedule depends on them (`_must_sync`): then step N is collected first. One call
        returns the outputs of the step it collected (the first call: none yet).
        """
        outputs: list[EngineCoreOutput] = []
        if self._in_flight is not None and self._must_sync():
            outputs = self._collect()
        scheduler_output = (self.scheduler.schedule() if self.scheduler.has_requests()
                            else None)
        failed = self.scheduler.take_failed_outputs()
        if self._in_flight is not None:
            outputs += self._collect()  # while scheduling, step N ran
        if scheduler_output is not None:
            if scheduler_output.total_num_scheduled_tokens:
                self._in_flight = (scheduler_output,
                                   self.executor.execute_model_async(scheduler_output))
            elif scheduler_output.finished_req_ids:
                self.executor.execute_model(scheduler_output)  # workers drop their states
            elif not failed and not outputs:
                self.scheduler.wait_for_grammars(GRAMMAR_WAIT_S)
        if self._in_flight is None:
            self._flush_finished()
        return failed + outputs

    def _must_sync(self) -> bool:
        """Whether the next schedule needs the tokens of the step in flight: ranks other
        than the sampling one learn tokens only from the scheduler, speculative decoding
        proposes from the accepted tokens (the scheduler then books at update time), and
        the scheduler's own reasons (grammars, prompt logprobs, pooling)."""
        return (self.executor.world_size > 1 or not self.scheduler.async_scheduling
                or self.scheduler.needs_sync())

    def _collect(self) -> list[EngineCoreOutput]:
        scheduler_output, future = self._in_flight
        self._in_flight = None
        return self.scheduler.update_from_output(scheduler_output, future.result())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.get_stats()

    # -------------------------------------------------------------- utilities
    def call_utility(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run the admin operation `name` (vllm/engine/utility.py): the one entry the
        frontends use for everything that is not a request."""
        return get_utility(name).run(self, *args, **kwargs)

    def collective_rpc(self, method: WorkerMethod, timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        """Run a worker method (or a function of the worker) on every rank."""
        return self.executor.collective_rpc(method, timeout=timeout, args=args,
                                            kwargs=kwargs, unique_reply_rank=unique_reply_rank)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (False while requests hold blocks)."""
        return self.scheduler.kv_cache_manager.reset_prefix_cache()

    def check_health(self) -> None:
        """Raise when the executor lost a worker (RuntimeError); cheap, callable anytime."""
        self.executor.check_health()

    # ------------------------------------------------------------- profiling
    def start_profile(self) -> None:
        # Refused here, before any rank is asked.
        check_profiler_enabled(getattr(self.vllm_config, "profiler_config", None))
        if self._profiling:
            raise ValueError("The profiler is already running; call stop_profile() first.")
        self.collective_rpc("start_profile")
        self._profiling = True

    def stop_profile(self) -> None:
        check_profiler_enabled(getattr(self.vllm_config, "profiler_config", None))
        if not self._profiling:
            raise ValueError("The profiler is not running; call start_profile() first.")
        self._profiling = False
        self.collective_rpc("stop_profile")

    # ------------------------------------------------------------ sleep mode
    def sleep(self, level: int = 1) -> None:
        """Free the KV cache and offload (level 1) or discard (level 2) the weights on
        every rank (vllm/worker/sleep_mode.py). Refused while requests run: their KV
        blocks would vanish under them."""
        if not self.vllm_config.model_config.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled; start the engine with "
                             "enable_sleep_mode=True (--enable-sleep-mode).")
        check_sleep_level(level)
        if level == 2:
            check_level2_supported(self.vllm_config)
        if self._sleeping_tags:
            logger.warning("The engine is already sleeping.")
            return
        if self.scheduler.has_unfinished_requests():
            raise ValueError("The engine cannot sleep while requests are running; wait for "
                             "them to finish or abort them first.")
        self.reset_prefix_cache()  # the cached blocks' contents are about to go
        start = time.perf_counter()
        self.collective_rpc("sleep", kwargs={"level": level})
        self._sleeping_tags = set(SLEEP_TAGS)
        logger.info("The engine is sleeping (level %d); it took %.2f s.", level,
                    time.perf_counter() - start)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore what `sleep` released (or only `tags`: "weights", "kv_cache")."""
        wanted = check_wake_tags(tags)
        if not self._sleeping_tags:
            logger.warning("The engine is not sleeping.")
            return
        start = time.perf_counter()
        self.collective_rpc("wake_up", kwargs={"tags": list(wanted)})
        self._sleeping_tags.difference_update(wanted)
        logger.info("Woke up %s in %.2f s%s.", "/".join(wanted), time.perf_counter() - start,
                    "" if not self._sleeping_tags else
                    f"; still asleep: {'/'.join(sorted(self._sleeping_tags))}")

    def is_sleeping(self) -> bool:
        """Until every tag is woken up (requests are refused meanwhile)."""
        return bool(self._sleeping_tags)

    def check_awake(self) -> None:
        """ValueError while asleep: a request would find no weights or KV cache."""
        if self._sleeping_tags:
            raise ValueError("The engine is sleeping; call wake_up() before adding "
                             "requests.")

    def shutdown(self) -> None:
        if self._in_flight is not None:
            try:
                self._in_flight[1].result()  # let the step end before the workers do
            except Exception:  # noqa: BLE001 - shutting down: its error changes nothing
                pass
            self._in_flight = None
        self.scheduler.structured_output_manager.shutdown()
        self.executor.shutdown()
