"""Helpers for HPU engine tests: the fake HPU platform, small bucket ranges, prompts."""
from __future__ import annotations

import contextlib
import gc
import os
import random
from typing import Iterator

import pytest
import torch

SMALL_BUCKETS = {
    # Few buckets, so a warmup takes seconds; see HPUBucketingContext for the ranges.
    "VLLM_PROMPT_BS_BUCKET_MAX": "2",
    "VLLM_PROMPT_SEQ_BUCKET_MAX": "128",
    "VLLM_DECODE_BS_BUCKET_MAX": "4",
}
ALL_HPU_KNOBS = ["VLLM_SKIP_WARMUP", "VLLM_EXPONENTIAL_BUCKETING", "VLLM_CONTIGUOUS_PA",
                 "VLLM_GRAPH_RESERVED_MEM", "VLLM_GRAPH_PROMPT_RATIO", "PT_HPU_LAZY_MODE",
                 "VLLM_GRAPH_PROMPT_STRATEGY", "VLLM_GRAPH_DECODE_STRATEGY",
                 "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION", "VLLM_DEFRAG_THRESHOLD",
                 "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION_ALL", "VLLM_FAKE_HPU_MEMORY_GB",
                 "VLLM_BUCKETING_STRATEGY", "VLLM_BUCKET_PLAN", "VLLM_BUCKET_TRACE",
                 "VLLM_WARMUP_BUDGET_S", "VLLM_PROMPT_PASS_OVERHEAD_TOKENS"] + [
    f"VLLM_{k}_{d}_BUCKET_{p}" for k in ("PROMPT", "DECODE") for d in ("BS", "SEQ", "BLOCK")
    for p in ("MIN", "STEP", "MAX")]


RUNTIME_SETTINGS = ("PT_HPU_WEIGHT_SHARING", "RUNTIME_SCALE_PATCHING")
"""Set by the HPU platform's choice when unset (with PT_HPU_ENABLE_LAZY_COLLECTIVES
and torch._dynamo's switch in lazy mode)."""


@contextlib.contextmanager
def platform_env(target: str, **env: str) -> Iterator[None]:
    """Select the CPU or the fake HPU platform (plus env knobs) for the block."""
    from vllm.platforms import _reset_current_platform
    with pytest.MonkeyPatch.context() as mp:
        for name in ALL_HPU_KNOBS:
            mp.delenv(name, raising=False)
        # The HPU platform sets this one itself for TP with graphs: restore it after.
        mp.setenv("PT_HPU_ENABLE_LAZY_COLLECTIVES", "false")
        # So does the HPU platform's choice (Gaudi's runtime settings, vllm/hpu/plugin.py):
        # undo them after the block, or one mode's settings leak into the next test.
        for name in RUNTIME_SETTINGS:
            if name in os.environ:
                mp.setenv(name, os.environ[name])
            else:
                mp.setenv(name, "unset")  # records "unset" for the undo
                mp.delenv(name)
        mp.setattr(torch._dynamo.config, "disable", torch._dynamo.config.disable)
        mp.setenv("VLLM_TARGET_DEVICE", target)
        if target == "hpu":
            mp.setenv("VLLM_USE_FAKE_HPU", "1")
        else:
            mp.delenv("VLLM_USE_FAKE_HPU", raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        _reset_current_platform()
        try:
            yield
        finally:
            _reset_current_platform()
    _reset_current_platform()


def make_llm(**kwargs):
    """An fp32 LLM with the test defaults; one CPU thread (the machine is shared)."""
    from vllm import LLM
    args = dict(dtype="float32", max_model_len=512, max_num_seqs=16)
    args.update(kwargs)
    llm = LLM(**args)
    torch.set_num_threads(1)
    return llm


def runner_of(llm):
    return llm.llm_engine.engine_core.executor.worker.model_runner


def release(llm) -> None:
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


def ragged_prompt_ids(tokenizer, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Token-id prompts of exactly the given lengths, from a fixed word list."""
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
             "brew potions near an old stone bridge in the valley of rivers and hills "
             "where merchants trade silk spices copper tools and stories").split()
    rng = random.Random(seed)
    prompts = []
    for n in lengths:
        text = " ".join(rng.choice(words) for _ in range(n * 2))
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) >= n
        prompts.append(ids[:n])
    return prompts


@pytest.fixture(scope="module", autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
