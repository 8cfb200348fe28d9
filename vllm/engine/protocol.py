"""EngineClient: everything a server may ask of an engine, and nothing more.

The OpenAI server (vllm/entrypoints/openai) talks to the engine only through
these members, so any engine that implements them can serve: the async engine
(`AsyncLLMEngine`, one engine loop in a thread), the data-parallel engine
(`DPAsyncLLMEngine`, several replicas behind one client) or a test double. What
lies behind (the LLMEngine, its scheduler, its workers) stays private.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, AsyncGenerator, Iterable, Optional, Union


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

    @abstractmethod
    async def get_model_config(self) -> Any:
        """The ModelConfig being served."""

    @abstractmethod
    async def get_vllm_config(self) -> Any:
        """The full VllmConfig (None for engines without one)."""

    @abstractmethod
    async def is_tracing_enabled(self) -> bool:
        """Whether OpenTelemetry tracing is on (never, yet)."""

    @property
    @abstractmethod
    def metrics_registry(self) -> Any:
        """The prometheus_client registry `/metrics` exposes (every engine's metrics)."""

    # ------------------------------------------------------------ requests
    @abstractmethod
    def generate(self, prompt: Any, sampling_params: Any, request_id: str, *,
                 priority: int = 0, arrival_time: Optional[float] = None,
                 ) -> AsyncGenerator[Any, None]:
        """Stream the RequestOutputs of one request; closing the generator aborts it."""

    @abstractmethod
    async def add_request(self, request_id: str, prompt: Any, params: Any,
                          arrival_time: Optional[float] = None) -> Any:
        """Queue a request; returns its stream once accepted (ValueError when invalid),
        to be consumed with `iterate`."""

    @abstractmethod
    def iterate(self, stream: Any) -> AsyncGenerator[Any, None]:
        """The outputs of a stream from `add_request`; aborts it if closed early."""

    @abstractmethod
    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests (unknown ids are ignored)."""

    # ----------------------------------------------------------------- LoRA
    @abstractmethod
    async def add_lora(self, lora_request: Any) -> bool:
        """Load a LoRA adapter on every worker (False when it was already loaded)."""

    @abstractmethod
    async def remove_lora(self, lora_id: int) -> bool:
        """Unload a LoRA adapter (False when it was not loaded)."""

    @abstractmethod
    async def list_loras(self) -> set[int]:
        """Ids of the loaded LoRA adapters."""

    # ------------------------------------------------------------ lifecycle
    @abstractmethod
    def start_background_loop(self) -> None:
        """Start the engine loop on the running event loop (idempotent)."""

    @abstractmethod
    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop serving, end every stream, free the engine and its workers."""
