"""A worker that dies while the engine is idle, with the engine core in its own process
(the server's default): the core notices within its idle health check and exits, and
the frontend reports the core's reason (the dead rank), not only an exit code."""
from __future__ import annotations

import gc
import os
import signal
import time

import pytest

from _dist_helpers import ENGINE_KWARGS, greedy_token_ids


@pytest.mark.timeout(180)
def test_idle_worker_death_reaches_the_frontend(tiny_qwen2, tiny_reference, monkeypatch):
    from vllm import LLM
    from vllm.engine.core_client import EngineCoreDeadError
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = LLM(tiny_qwen2, tensor_parallel_size=2, distributed_executor_backend="mp",
              **ENGINE_KWARGS)
    try:
        assert greedy_token_ids(llm) == tiny_reference
        os.kill(llm.collective_rpc(lambda w: os.getpid())[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        with pytest.raises(EngineCoreDeadError, match="rank 1 .*died unexpectedly"):
            while time.monotonic() < deadline:
                llm.llm_engine.check_health()  # no request: only the idle check can tell
                time.sleep(0.2)
    finally:
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
