"""`AsyncLLMEngine.from_engine_args(while_core_starts=...)`: the caller's set-up runs once
the tokenizer is loaded and before the core process is waited for; the engine is built
only after the core is ready (its KV cache size known); a failing set-up stops the core."""
from __future__ import annotations

import psutil
import pytest

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine


def _args(model: str) -> AsyncEngineArgs:
    return AsyncEngineArgs(model=model, dtype="float32", max_model_len=128,
                           kv_cache_memory_bytes=16 << 20)


def test_setup_runs_while_the_core_starts(tiny_model_factory, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    seen = []

    def setup(llm_engine) -> None:
        seen.append((llm_engine.tokenizer is not None, llm_engine.engine_core._ready))

    engine = AsyncLLMEngine.from_engine_args(_args(tiny_model_factory("llama")),
                                             start_engine_loop=False, while_core_starts=setup)
    try:
        assert seen == [(True, False)]  # tokenizer loaded, core not waited for yet
        assert engine.engine.engine_core._ready
        assert engine.vllm_config.cache_config.num_gpu_blocks > 0
    finally:
        engine.shutdown()


def test_a_failing_setup_stops_the_core(tiny_model_factory, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def setup(llm_engine) -> None:
        raise RuntimeError("set-up failed")

    with pytest.raises(RuntimeError, match="set-up failed"):
        AsyncLLMEngine.from_engine_args(_args(tiny_model_factory("llama")),
                                        start_engine_loop=False, while_core_starts=setup)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
    _, alive = psutil.wait_procs(left, timeout=15)
    assert not alive, alive
