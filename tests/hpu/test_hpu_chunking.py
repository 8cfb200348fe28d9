"""Prompts are chunked on HPU only where buckets cover the chunks (platform.py)."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import platform_env


@pytest.mark.parametrize("prefix_caching,budget,chunked", [
    (False, None, False),   # every prompt fits a step, no context buckets: whole prompts
    (True, None, True),     # prefix caching: context buckets exist, chunks are covered
    (False, 128, True),     # budget < max_model_len: chunking is how long prompts run
])
def test_chunked_prefill_follows_the_context_buckets(tiny_model_factory, prefix_caching,
                                                     budget, chunked):
    from vllm.engine.arg_utils import EngineArgs
    path = tiny_model_factory("llama")
    with platform_env("hpu"):
        config = EngineArgs(model=path, max_model_len=256, enable_prefix_caching=prefix_caching,
                            max_num_batched_tokens=budget).create_engine_config()
    assert config.scheduler_config.enable_chunked_prefill is chunked
