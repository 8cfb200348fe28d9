"""EngineClient: everything a server may ask of an engine, and nothing more.

The OpenAI server (vllm/entrypoints/openai) talks to the engine only through
these members, so any engine that implements them can serve: the async engine
(`AsyncLLMEngine`, one engine loop in a thread), the data-parallel engine
(`DPAsyncLLMEngine`, several replicas behind one client) or a test double. What
lies behind (the LLMEngine, its scheduler, its workers) stays private.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, AsyncGenerator, Iterable, Mapping, Optional, Union


class EngineDeadError(RuntimeError):
    """The engine loop stopped (crash or shutdown); no request can be served any more.

    Part of the client contract: a server tells it apart from other failures (503).
    """


class EngineClient(ABC):
    """The engine as the server sees it (vLLM's `vllm.engine.protocol.EngineClient`).

    Implementations set `model_config` and `vllm_config` (None where the engine has
    no full config, e.g. a test double).
    """

    model_config: Any
    vllm_config: Any

    # ---------------------------------------------------------------- state
    @property
    @abstractmethod
    def is_running(self) -> bool:
        """The engine loop is up and serving."""

    @property
    @abstractmethod
    def is_stopped(self) -> bool:
        """The engine stopped (failed or shut down) and serves no more requests."""

    @property
    @abstractmethod
    def errored(self) -> bool:
        """The engine failed (as opposed to being shut down)."""

    @property
    @abstractmethod
    def dead_error(self) -> Optional[BaseException]:
        """Why the engine stopped (an EngineDeadError), or None while it runs."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raise EngineDeadError when the engine can no longer serve."""

    # --------------------------------------------------------------- config
    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The engine's tokenizer (for the server's own copy, made at start-up)."""

    @abstractmethod
    async def get_tokenizer(self) -> Any:
        """The engine's tokenizer."""

    async def get_model_config(self) -> Any:
        """The ModelConfig being served."""
        return self.model_config

    async def get_vllm_config(self) -> Any:
        """The full VllmConfig (None for engines without one)."""
        return self.vllm_config

    async def is_tracing_enabled(self) -> bool:
        """Whether OpenTelemetry tracing is on (never, yet)."""
        return False

    @property
    @abstractmethod
    def metrics_registry(self) -> Any:
        """The prometheus_client registry `/metrics` exposes (every engine's metrics)."""

    # ------------------------------------------------------------ requests
    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, *,
                       lora_request: Any = None, priority: int = 0,
                       arrival_time: Optional[float] = None,
                       trace_headers: Optional[Mapping[str, str]] = None
                       ) -> AsyncGenerator[Any, None]:
        """Stream the RequestOutputs of one request (`add_request`, then `iterate`);
        closing the generator early (client gone, task cancelled) aborts the request,
        which frees its KV blocks."""
        extra: dict[str, Any] = {"priority": priority} if priority else {}
        if trace_headers:
            extra["trace_headers"] = trace_headers
        stream = await self.add_request(request_id, prompt, sampling_params, arrival_time,
                                        lora_request, **extra)
        async for output in self.iterate(stream):
            yield output

    async def encode(self, prompt: Any, pooling_params: Any, request_id: str, *,
                     lora_request: Any = None, priority: int = 0,
                     arrival_time: Optional[float] = None) -> AsyncGenerator[Any, None]:
        """A pooling request (PoolingParams) on a pooling model: its one
        PoolingRequestOutput, as a stream like `generate`'s (vLLM's name)."""
        async for output in self.generate(prompt, pooling_params, request_id,
                                          lora_request=lora_request, priority=priority,
                                          arrival_time=arrival_time):
            yield output

    @abstractmethod
    async def add_request(self, request_id: str, prompt: Any, params: Any,
                          arrival_time: Optional[float] = None,
                          lora_request: Any = None, priority: int = 0,
                          trace_headers: Optional[Mapping[str, str]] = None) -> Any:
        """Queue a request; returns its stream once accepted (ValueError when invalid),
        to be consumed with `iterate`. `priority` orders it under --scheduling-policy
        priority (lower first; refused otherwise unless 0); `trace_headers` (W3C trace
        context) parent its span when tracing is on."""

    @abstractmethod
    def iterate(self, stream: Any) -> AsyncGenerator[Any, None]:
        """The outputs of a stream from `add_request`; aborts it if closed early."""

    @abstractmethod
    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests (unknown ids are ignored)."""

    # ------------------------------------------------------------ admin
    @abstractmethod
    async def call_utility(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run the admin operation `name` (vllm/engine/utility.py) between engine steps
        (on every replica of a data-parallel engine); its result, or its error."""

    # vLLM's names for the admin operations, each one utility call.
    async def add_lora(self, lora_request: Any) -> bool:
        """Load a LoRA adapter on every worker (False when it was already loaded)."""
        return await self.call_utility("add_lora", lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        """Unload a LoRA adapter (False when it was not loaded)."""
        return await self.call_utility("remove_lora", lora_id)

    async def list_loras(self) -> set[int]:
        """Ids of the loaded LoRA adapters."""
        return await self.call_utility("list_loras")

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (False when running requests still hold blocks)."""
        return await self.call_utility("reset_prefix_cache")

    async def sleep(self, level: int = 1) -> None:
        """Free the KV cache and offload (1) or discard (2) the weights (needs
        enable_sleep_mode; refused while requests run)."""
        await self.call_utility("sleep", level)

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore what sleep released ("weights", "kv_cache"; default both)."""
        await self.call_utility("wake_up", tags)

    async def is_sleeping(self) -> bool:
        return await self.call_utility("is_sleeping")

    async def start_profile(self) -> None:
        """Start the torch profiler on every worker (needs VLLM_TORCH_PROFILER_DIR)."""
        await self.call_utility("start_profile")

    async def stop_profile(self) -> None:
        """Stop it: every worker writes its trace under VLLM_TORCH_PROFILER_DIR."""
        await self.call_utility("stop_profile")

    async def collective_rpc(self, method: Any, timeout: Optional[float] = None,
                             args: tuple = (), kwargs: Optional[dict[str, Any]] = None
                             ) -> list[Any]:
        """A worker method (name) or function of the worker on every rank: the results."""
        return await self.call_utility("collective_rpc", method, timeout=timeout, args=args,
                                       kwargs=kwargs)

    # In-place weight updates (vLLM's RL surface; vllm/distributed/weight_transfer/).
    # `request`: a WeightTransfer*Request or {"init_info": ...} / {"update_info": ...}.
    async def init_weight_transfer_engine(self, request: Any) -> None:
        from vllm.engine.weight_requests import request_info
        await self.call_utility("init_weight_transfer_engine",
                                request_info(request, "init_info"))

    async def start_weight_update(self) -> None:
        await self.call_utility("start_weight_update")

    async def update_weights(self, request: Any) -> None:
        from vllm.engine.weight_requests import request_info
        await self.call_utility("update_weights", request_info(request, "update_info"))

    async def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        """End the update (no prefix cached before is reused); label it if given."""
        await self.call_utility("finish_weight_update", weight_version)

    async def update_weight_version(self, new_version: str) -> None:
        await self.call_utility("update_weight_version", new_version)

    async def get_weight_version(self) -> Optional[str]:
        return await self.call_utility("get_weight_version")

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True,
                               wait_for_inflight_requests: bool = False) -> None:
        """Stop generating around a weight update (vllm/engine/pause.py)."""
        raise ValueError(f"{type(self).__name__} cannot pause generation.")

    async def resume_generation(self) -> None:
        raise ValueError(f"{type(self).__name__} cannot pause generation.")

    async def is_paused(self) -> bool:
        return False

    # ------------------------------------------------------------ lifecycle
    @abstractmethod
    def start_background_loop(self) -> None:
        """Start the engine loop on the running event loop (idempotent)."""

    @abstractmethod
    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop serving, end every stream, free the engine and its workers."""
