"""The server talks to its engine only through the EngineClient protocol."""
from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_engine import FakeLLMEngine

from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.dp_engine import DPAsyncLLMEngine
from vllm.engine.protocol import EngineClient

PROTOCOL_NAMES = frozenset(EngineClient.__abstractmethods__) | frozenset(
    EngineClient.__annotations__) | frozenset(
    name for name in vars(EngineClient) if not name.startswith("_"))


class ProtocolOnly(EngineClient):
    """Forwards the protocol's members to a real engine and nothing else, so a server
    reaching past the protocol (`engine.engine`, `engine.stats`...) fails loudly."""

    def __init__(self, inner: AsyncLLMEngine) -> None:
        object.__setattr__(self, "_inner", inner)
        self.touched: set[str] = set()

    def __getattribute__(self, name: str):
        if name in ("_inner", "touched", "__class__", "__dict__") or name.startswith("__"):
            return object.__getattribute__(self, name)
        if name not in PROTOCOL_NAMES:
            raise AttributeError(f"the server used {name!r}, which is not in EngineClient")
        object.__getattribute__(self, "touched").add(name)
        return getattr(object.__getattribute__(self, "_inner"), name)

    # The abstract members are served by __getattribute__; these only make the class
    # concrete.
    is_running = is_stopped = errored = dead_error = tokenizer = metrics_registry = None
    check_health = get_tokenizer = None
    generate = add_request = iterate = abort = None
    start_background_loop = shutdown = call_utility = None


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))


def test_async_and_data_parallel_engines_are_engine_clients():
    assert issubclass(AsyncLLMEngine, EngineClient)
    assert issubclass(DPAsyncLLMEngine, EngineClient)
    assert {"generate", "abort", "get_tokenizer", "get_model_config", "check_health",
            "is_running", "errored", "metrics_registry"} <= PROTOCOL_NAMES


def test_server_routes_use_only_the_protocol(tokenizer):
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    inner = AsyncLLMEngine(FakeLLMEngine(tokenizer), log_requests=False, log_stats=False)
    engine = ProtocolOnly(inner)
    app = build_app(make_arg_parser().parse_args([]), engine)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [
                await client.get("/health"),
                await client.get("/v1/models"),
                await client.get("/metrics"),
                await client.post("/tokenize", json={"prompt": "hi"}),
                await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3}),
                await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3,
                                                           "stream": True}),
                await client.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
            ]

    try:
        responses = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        inner.shutdown()
    assert [r.status_code for r in responses] == [200] * len(responses), \
        [r.text for r in responses]
    assert responses[4].json()["choices"][0]["text"]
    assert {"tokenizer", "metrics_registry", "check_health", "add_request",
            "iterate"} <= engine.touched


class UtilityEngine(FakeLLMEngine):
    """A fake engine answering admin calls as replica `index` would."""

    def __init__(self, tokenizer, index: int) -> None:
        super().__init__(tokenizer)
        self.index = index
        self.calls: list[tuple] = []

    def call_utility(self, name, *args, **kwargs):
        self.calls.append((name, args, kwargs))
        if name == "collective_rpc":
            return [f"replica{self.index}-rank0", f"replica{self.index}-rank1"]
        if name in ("is_sleeping", "add_lora"):
            return self.index == 1
        return None


def test_data_parallel_admin_calls_fan_out_to_every_replica(tokenizer):
    inner = [UtilityEngine(tokenizer, i) for i in range(2)]
    replicas = [AsyncLLMEngine(e, log_requests=False, log_stats=False) for e in inner]
    dp = DPAsyncLLMEngine(replicas)

    async def main():
        return (await dp.collective_rpc("get_device_index", timeout=5.0),
                await dp.is_sleeping(), await dp.add_lora("adapter"), await dp.sleep(2))

    try:
        results = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        dp.shutdown()
    assert results == (["replica0-rank0", "replica0-rank1", "replica1-rank0",
                        "replica1-rank1"], True, True, None)
    for engine in inner:
        assert [c[0] for c in engine.calls] == ["collective_rpc", "is_sleeping", "add_lora",
                                                "sleep"]
        assert engine.calls[0][1] == ("get_device_index",)
        assert engine.calls[0][2] == {"timeout": 5.0, "args": (), "kwargs": None}
        assert engine.calls[3][1] == (2,)
