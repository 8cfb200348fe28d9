"""Data parallel serving: N engine replicas behind one OpenAI server.

`--data-parallel-size N` builds N independent AsyncLLMEngines (each with its own
scheduler, KV cache and workers; each may itself be tensor/pipeline parallel) and
`DPAsyncLLMEngine` presents them to the server as one engine:

- routing: a new request goes to the replica with the least work, as vLLM's
  coordinator counts it: the requests its core reports waiting or running (every
  frontend hears every core's stats, so several API servers balance together), plus
  those this frontend sent it since that report (ties rotate, so an idle server
  spreads a burst evenly);
- metrics: /metrics exposes every replica's series with an `engine` label ("0",
  "1", ...), as vLLM does; sum over the label for totals;
- health: the server is unhealthy (503) as soon as any replica is dead.

Why replicas run their model in worker processes (the executor defaults to `mp`
even for one rank): the replicas' engine loops are threads of the server process,
and only processes run torch work side by side without sharing one interpreter.
The CPU worker divides the cores by world size x data_parallel_size.

Offline `LLM(data_parallel_size=N)` is not supported (vLLM's offline data parallel
is a different, multi-launch mechanism); the server is the way to use it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncGenerator, Callable, Iterable, Mapping, Optional, Union

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError, RequestStream
from vllm.engine.protocol import EngineClient
from vllm.engine.utility import get_utility

logger = logging.getLogger(__name__)


def build_async_engine(engine_args: AsyncEngineArgs, start_engine_loop: bool = True,
                       max_log_len: Optional[int] = None,
                       while_core_starts: Optional[Callable[[Any], None]] = None
                       ) -> Union[AsyncLLMEngine, "DPAsyncLLMEngine"]:
    """The server's engine: one AsyncLLMEngine, or a DPAsyncLLMEngine for data parallel.
    `while_core_starts`: see AsyncLLMEngine.from_engine_args (one engine only)."""
    if engine_args.data_parallel_size > 1:
        return DPAsyncLLMEngine.from_engine_args(engine_args, start_engine_loop, max_log_len)
    return AsyncLLMEngine.from_engine_args(engine_args, start_engine_loop, max_log_len,
                                           while_core_starts=while_core_starts)


def build_remote_engine(engine_args: AsyncEngineArgs, addresses: list[str],
                        max_log_len: Optional[int] = None
                        ) -> Union[AsyncLLMEngine, "DPAsyncLLMEngine"]:
    """An API server's engine over shared cores already running at `addresses` (one per
    data-parallel rank; vllm/engine/dp_cores.py): this process tokenizes, detokenizes
    and streams, the cores step."""
    replicas: list[AsyncLLMEngine] = []
    try:
        for rank, address in enumerate(addresses):
            replicas.append(_build_replica(engine_args, rank, True, max_log_len,
                                           core_address=address))
    except BaseException:
        for r in replicas:
            r.shutdown()
        raise
    return replicas[0] if len(replicas) == 1 else DPAsyncLLMEngine(replicas)


def prestart_engine_core(data_parallel_size: int, engine_args: AsyncEngineArgs) -> bool:
    """Build the server's config from `engine_args` and fork its engine-core process
    with it now, so that the core initializes while the server imports its web stack
    and builds its engine (vllm/engine/core_launch.py); the engine that
    `build_async_engine` makes from equal arguments runs that config and takes the
    core. Not for data parallel, whose replicas keep their cores in this process. True
    if a core was started."""
    from vllm.engine import core_launch
    from vllm.engine.core_client import use_multiprocessing
    if use_multiprocessing(default=True) and data_parallel_size == 1:
        return core_launch.prestart(engine_args)
    return False


def release_engine_core() -> None:
    """An early core the engine did not take (it runs in-process) exits now."""
    from vllm.engine import core_launch
    core_launch.release()


def _build_replica(engine_args: AsyncEngineArgs, rank: int, start_engine_loop: bool,
                   max_log_len: Optional[int], core_address: Optional[str] = None
                   ) -> AsyncLLMEngine:
    """Replica `rank`: its config says which one it is, so its workers take their own
    devices (see WorkerBase.device_index) instead of all starting at device 0.
    `core_address`: its engine core runs elsewhere already (build_remote_engine)."""
    from vllm.engine.dp_cores import rank_config
    from vllm.engine.llm_engine import LLMEngine
    engine = LLMEngine(rank_config(engine_args, rank),
                       log_stats=not engine_args.disable_log_stats, core_address=core_address)
    return AsyncLLMEngine(engine, log_requests=engine_args.log_requests,
                          log_outputs=engine_args.enable_log_outputs,
                          log_stats=not engine_args.disable_log_stats,
                          max_log_len=max_log_len, start_engine_loop=start_engine_loop)


class DPAsyncLLMEngine(EngineClient):
    """Several AsyncLLMEngine replicas behind one EngineClient."""

    def __init__(self, replicas: list[AsyncLLMEngine]) -> None:
        if not replicas:
            raise ValueError("data_parallel_size must be >= 1 (no replicas given).")
        self.replicas = replicas
        self.model_config = replicas[0].model_config
        self.vllm_config = replicas[0].vllm_config
        self.stats = DPStats(replicas)
        self._owner: dict[str, int] = {}
        """Replica of each outstanding request id."""
        self._stream_replica: "weakref.WeakKeyDictionary[RequestStream, int]" = (
            weakref.WeakKeyDictionary())
        """Replica of each stream, for iterate() even after its id was released."""
        self._outstanding = [0] * len(replicas)
        self._unreported = [0] * len(replicas)
        """Requests sent to each replica since its core's last stats."""
        self._reported: list[Any] = [None] * len(replicas)
        self._next = 0
        self._shutdown_done = False

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, start_engine_loop: bool = True,
                         max_log_len: Optional[int] = None) -> "DPAsyncLLMEngine":
        """Build the replicas side by side (their workers load the model in parallel)."""
        dp = engine_args.data_parallel_size
        if engine_args.distributed_executor_backend is None:
            engine_args = dataclasses.replace(engine_args, distributed_executor_backend="mp")
        engine_args.create_engine_config()  # bad flags fail here, before any replica starts
        logger.info("Starting %d data parallel engine replicas.", dp)

        def build(rank: int) -> AsyncLLMEngine:
            return _build_replica(engine_args, rank, start_engine_loop, max_log_len)

        with ThreadPoolExecutor(max_workers=dp, thread_name_prefix="vllm-dp-init") as pool:
            futures = [pool.submit(build, i) for i in range(dp)]
        replicas, errors = [], []
        for f in futures:
            try:
                replicas.append(f.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below after cleanup
                errors.append(exc)
        if errors:
            for r in replicas:
                r.shutdown()
            raise errors[0]
        return cls(replicas)

    @property
    def data_parallel_size(self) -> int:
        return len(self.replicas)

    # --------------------------------------------------------------- state
    @property
    def is_running(self) -> bool:
        return all(r.is_running for r in self.replicas)

    @property
    def errored(self) -> bool:
        return any(r.errored for r in self.replicas)

    @property
    def is_stopped(self) -> bool:
        return any(r.is_stopped for r in self.replicas)

    @property
    def dead_error(self) -> Optional[EngineDeadError]:
        for i, r in enumerate(self.replicas):
            if r.dead_error is not None:
                return EngineDeadError(f"Data parallel replica {i}: {r.dead_error}")
        return None

    async def check_health(self) -> None:
        """Raise EngineDeadError when any replica is dead."""
        for i, r in enumerate(self.replicas):
            try:
                await r.check_health()
            except EngineDeadError as e:
                raise EngineDeadError(f"Data parallel replica {i}: {e}") from e

    @property
    def tokenizer(self) -> Any:
        return self.replicas[0].tokenizer

    async def get_tokenizer(self) -> Any:
        return await self.replicas[0].get_tokenizer()

    @property
    def metrics_registry(self) -> Any:
        return self.stats.registry

    def start_background_loop(self) -> None:
        for r in self.replicas:
            r.start_background_loop()

    # ------------------------------------------------------------ requests
    def pick_replica(self) -> int:
        """Index of the replica with the least load (ties rotate)."""
        n = len(self.replicas)
        loads = [self._load(i) for i in range(n)]
        order = [(self._next + k) % n for k in range(n)]
        best = min(order, key=loads.__getitem__)
        self._next = (best + 1) % n
        self._unreported[best] += 1
        return best

    def _load(self, index: int) -> int:
        """Waiting + running requests by the core's last stats, plus those sent since
        (before any stats: what this frontend has outstanding there)."""
        stats = getattr(self.replicas[index].stats, "last_scheduler_stats", None)
        if stats is None:
            return self._outstanding[index]
        if stats is not self._reported[index]:
            self._reported[index] = stats
            self._unreported[index] = 0
        return stats.num_waiting_reqs + stats.num_running_reqs + self._unreported[index]

    async def add_request(self, request_id: str, prompt: Any, params: Any,
                          arrival_time: Optional[float] = None,
                          lora_request: Any = None, priority: int = 0,
                          trace_headers: Optional[Mapping[str, str]] = None) -> RequestStream:
        if request_id in self._owner:
            raise ValueError(f"request_id {request_id!r} is already in use by a running "
                             "request.")
        index = self.pick_replica()
        self._owner[request_id] = index
        self._outstanding[index] += 1
        try:
            extra: dict[str, Any] = {"priority": priority} if priority else {}
            if trace_headers:
                extra["trace_headers"] = trace_headers
            stream = await self.replicas[index].add_request(request_id, prompt, params,
                                                            arrival_time, lora_request, **extra)
        except BaseException:
            self._release(request_id)
            raise
        self._stream_replica[stream] = index
        return stream

    async def iterate(self, stream: RequestStream) -> AsyncGenerator[Any, None]:
        index = self._stream_replica[stream]
        try:
            async for output in self.replicas[index].iterate(stream):
                yield output
        finally:
            self._release(stream.request_id)

    async def call_utility(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Every replica runs the operation (each serves every adapter, sleeps, profiles);
        their answers are merged as the operation says (vllm/engine/utility.py)."""
        utility = get_utility(name)
        results = await asyncio.gather(*(r.call_utility(name, *args, **kwargs)
                                         for r in self.replicas))
        return utility.merge_replicas(list(results))

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True,
                               wait_for_inflight_requests: bool = False) -> None:
        """Every replica pauses (and resumes) together: one set of weights is served."""
        await asyncio.gather(*(r.pause_generation(mode, clear_cache,
                                                  wait_for_inflight_requests)
                               for r in self.replicas))

    async def resume_generation(self) -> None:
        await asyncio.gather(*(r.resume_generation() for r in self.replicas))

    async def is_paused(self) -> bool:
        return any([await r.is_paused() for r in self.replicas])

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        by_replica: dict[int, list[str]] = {}
        for rid in ids:
            if rid in self._owner:
                by_replica.setdefault(self._owner[rid], []).append(rid)
        for index, rids in by_replica.items():
            await self.replicas[index].abort(rids)
            for rid in rids:
                self._release(rid)

    def _release(self, request_id: str) -> None:
        index = self._owner.pop(request_id, None)
        if index is not None:
            self._outstanding[index] -= 1

    # ------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float = 30.0) -> None:
        """Shut every replica down at once (each waits for its loop and its workers)."""
        if self._shutdown_done:
            return
        self._shutdown_done = True
        with ThreadPoolExecutor(max_workers=len(self.replicas),
                                thread_name_prefix="vllm-dp-shutdown") as pool:
            list(pool.map(lambda r: r.shutdown(timeout), self.replicas))


class DPStats:
    """What the server reads from `engine.stats`: one registry over every replica."""

    def __init__(self, replicas: list[AsyncLLMEngine]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineLabelCollector([r.stats.registry for r in replicas]))


class EngineLabelCollector:
    """Merges per-replica registries into one exposition, adding `engine="<index>"`.

    Each metric family appears once, with every replica's samples in it, so the
    output stays valid Prometheus text (a family may not be repeated).
    """

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for index, registry in enumerate(self.registries):
            for family in registry.collect():
                out = merged.get(family.name)
                if out is None:
                    out = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = out
                for s in family.samples:
                    out.add_sample(s.name, {**s.labels, "engine": str(index)}, s.value,
                                   s.timestamp, s.exemplar)
        return list(merged.values())
