"""The HPU engine (fake HPU) gives the CPU engine's greedy output, whatever the bucketing.

Padding (dummy rows, padded tokens, the pad block), flat paged attention, prompt
attention with a context, prompt grouping and the defragmenter must all be
invisible: the default model in float32 must produce exactly the tokens the CPU
platform produces for the same ragged prompts.
"""
from __future__ import annotations

import logging
import re

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from vllm import SamplingParams
from vllm.hpu import habana
from vllm.hpu.bucketing import Bucket

# Ragged: within a block, exactly a block, several blocks, and longer than the
# chunk budget of the chunked run (block sizes 16 and 128 below).
LENGTHS = [2, 3, 5, 7, 9, 12, 15, 16, 19, 24, 30, 38, 47, 60, 130, 160]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
# Small prompt ranges keep the profile run (largest bucket) cheap; longer prompts
# take fallback buckets, which these tests (warmup skipped) do not mind. Most runs
# use block_size 16 so that padding (queries round up to blocks) stays cheap on a CPU.
FAST = {"VLLM_SKIP_WARMUP": "1", "PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
        "VLLM_PROMPT_SEQ_BUCKET_MAX": "64"}


def _generate(llm, prompts) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def reference():
    """Prompts and the CPU platform's greedy continuations (float32)."""
    with platform_env("cpu"):
        llm = make_llm(kv_cache_memory_bytes=64 << 20)
        prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
        # Two prompts sharing a long prefix with the longest one (prefix-cache hits).
        prompts += [prompts[-1][:140] + prompts[0], prompts[-1][:150] + prompts[1]]
        expected = _generate(llm, prompts)
        release(llm)
    return prompts, expected


@pytest.mark.parametrize("env,engine_kwargs", [
    pytest.param({"VLLM_EXPONENTIAL_BUCKETING": "true", "VLLM_CONTIGUOUS_PA": "true",
                  "VLLM_DEFRAG_THRESHOLD": "2"},
                 dict(block_size=16, enable_prefix_caching=False, num_gpu_blocks_override=34,
                      max_model_len=256),
                 id="exponential-contiguous-defrag-preempt"),
    pytest.param({"VLLM_EXPONENTIAL_BUCKETING": "false", "VLLM_CONTIGUOUS_PA": "false"},
                 dict(block_size=32, enable_prefix_caching=False), id="linear-gather"),
    pytest.param({}, dict(block_size=16, enable_prefix_caching=True), id="prefix-caching"),
    pytest.param({"VLLM_CONTIGUOUS_PA": "true"},
                 dict(block_size=16, enable_prefix_caching=False, max_num_batched_tokens=64),
                 id="chunked-prefill"),
])
def test_greedy_output_equals_cpu(reference, env, engine_kwargs):
    prompts, expected = reference
    with platform_env("hpu", **{**FAST, **env}):
        llm = make_llm(**engine_kwargs)
        runner = runner_of(llm)
        assert runner.contiguous_pa == (env.get("VLLM_CONTIGUOUS_PA") == "true")
        assert runner.bucketing.exponential == (env.get("VLLM_EXPONENTIAL_BUCKETING") != "false")
        first = _generate(llm, prompts)
        assert first == expected
        stats = llm.llm_engine.get_stats()
        if engine_kwargs.get("enable_prefix_caching"):
            # Same-step hits on blocks another prompt computes, then a full repeat.
            assert stats.prefix_cache_hits > 0
            assert _generate(llm, prompts[-4:]) == expected[-4:]
            assert llm.llm_engine.get_stats().prefix_cache_hits > stats.prefix_cache_hits
        if "num_gpu_blocks_override" in engine_kwargs:
            # A small pool: requests wait, get preempted and recomputed, and blocks
            # freed in between leave holes that the defragmenter compacts (moving
            # live blocks while requests run), none of which may change a token.
            assert stats.num_preemptions > 0
            assert runner.defragmenter.total_moves > 0
        release(llm)


WARMUP_ENV = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "2",
              "VLLM_PROMPT_SEQ_BUCKET_MAX": "128", "VLLM_DECODE_BS_BUCKET_MAX": "4",
              "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION": "1"}
WARMUP_LINES = [
    r"Prompt bucket config \(min, step, max_warmup\) bs:\[1, 2, 2\], seq:\[128, 128, 128\]",
    r"Generated 2 prompt buckets: \[\(1, 128, 0\), \(2, 128, 0\)\]",
    # Seed 001: decode config with `seq` (KV tokens: blocks x 128), at start-up.
    r"Decode bucket config \(min, step, max_warmup\) bs:\[1, 2, 4\], "
    r"seq:\[128, 16384, 16384\], block:\[1, 128, 128\]$",
    r"Free device memory: [\d.]+ \w+, [\d.]+ \w+ usable \(gpu_memory_utilization=0\.92\), "
    r"[\d.]+ \w+ reserved for HPUGraphs \(measured: [\d.]+ of usable\), [\d.]+ \w+ "
    r"reserved for KV cache",
    r"# HPU blocks: 16, # CPU blocks: 0",
    r"Initializing cache engine took -?[\d.]+ \w+ of device memory",
    # The block range (1, 128, 16) gives 1 and 16; the powers of two fill the gap.
    r"Generated 12 decode buckets: "
    r"\[\(1, 1, 1\), \(1, 1, 2\), \(1, 1, 4\), \(1, 1, 8\), \(1, 1, 16\), \(2, 1, 2\), ",
    r"\[Warmup\]\[Prompt\]\[1/2\] batch_size:2 seq_len:128 free_mem:[\d.]+ \w+ num_blocks:0",
    r"\[Warmup\]\[Decode\]\[12/12\] batch_size:1 seq_len:128 free_mem:[\d.]+ \w+ num_blocks:1",
    r"\[Warmup\]\[Graph/Prompt\]\[1/2\] batch_size:1 seq_len:128 free_mem:[\d.]+ \w+ "
    r"num_blocks:0",
    r"\[Warmup\]\[Graph/Decode\]\[1/12\] batch_size:4 seq_len:512 free_mem:[\d.]+ \w+ "
    r"num_blocks:4",
    r"Graph/Decode captured:12 \(100\.0%\) used_mem:",
    r"Warmup finished in \d+ secs, allocated [\d.]+ \w+ of device memory",
    r"init_cache_engine took -?[\d.]+ \w+ of device memory \([\d.]+ \w+/[\d.]+ \w+ used\) "
    r"and -?[\d.]+ \w+ of host memory \([\d.]+ \w+/[\d.]+ \w+ used\)$",
]
"""Seed 001's start-up lines (with this engine's extra fields after them), in the
order the seed prints them: this order is checked too."""
UNORDERED_LINES = [
    r"Pre-loading model weights on hpu:0 took [\d.]+ \w+ of device memory \([\d.]+ \w+/"
    r"[\d.]+ \w+ used\) and -?[\d.]+ \w+ of host memory \([\d.]+ \w+/[\d.]+ \w+ used\)",
    r"Wrapping in HPU Graph took -?[\d.]+ \w+ of device memory",
    r"Loading model weights took in total -?[\d.]+ \w+ of device memory .* in [\d.]+ s",
    r"Model profiling run took -?[\d.]+ \w+ of device memory \([\d.]+ \w+/[\d.]+ \w+ used\) "
    r"and -?[\d.]+ \w+ of host memory \([\d.]+ \w+/[\d.]+ \w+ used\)",
    r"Using [\d.]+ \w+/[\d.]+ \w+ of free device memory for HPUGraphs, [\d.]+ \w+ for prompt "
    r"and [\d.]+ \w+ for decode \(VLLM_GRAPH_PROMPT_RATIO=0\.\d+\)",
]


def _staggered(engine, prompts: dict[int, list[int]]) -> dict[int, list[int]]:
    """Two new requests every other step: prompt passes mix with decode passes."""
    pending, outputs, step = sorted(prompts.items()), {}, 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 2 == 0:
            for i, ids in pending[:2]:
                engine.add_request(str(i), {"prompt_token_ids": ids}, GREEDY)
            pending = pending[2:]
        for out in engine.step():
            if out.finished:
                outputs[int(out.request_id)] = list(out.outputs[0].token_ids)
        step += 1
    return outputs


def test_warmup_then_serving_compiles_nothing(reference, caplog):
    """Warmup (HPU graphs, default block size 128) logs every bucket; a mixed workload
    inside the limits then compiles nothing, and a prompt past the warmed range warns
    once, adds one bucket and captures its graph (compiling it and its logits gather
    once)."""
    prompts, expected = reference
    with platform_env("hpu", **WARMUP_ENV), caplog.at_level(logging.INFO, logger="vllm"):
        llm = make_llm(enable_prefix_caching=False, max_num_seqs=4, num_gpu_blocks_override=16)
        runner = runner_of(llm)
        messages = [r.getMessage() for r in caplog.records]
        first = []
        for pattern in WARMUP_LINES:
            hits = [i for i, m in enumerate(messages) if re.search(pattern, m)]
            assert hits, pattern
            first.append(hits[0])
        assert first == sorted(first), [WARMUP_LINES[i] for i in range(len(first))
                                         if first[i] != sorted(first)[i]]
        for pattern in UNORDERED_LINES:
            assert any(re.search(pattern, m) for m in messages), pattern
        stats = habana.graph_stats(runner.forward_module)
        captures, bypassed = stats.captures, stats.bypassed
        assert captures == len(runner.graphed_buckets) == 14
        assert runner.num_compiles_after_warmup == 0

        short = {i: p for i, p in enumerate(prompts) if len(p) <= 120 and i % 2}
        assert len(short) >= 6
        outputs = _staggered(llm.llm_engine, short)
        assert all(outputs[i] == expected[i] for i in short)
        assert runner.num_compiles_after_warmup == 0
        assert (stats.captures, runner.bucketing.fallback_buckets) == (captures, [])
        assert stats.replays > 20 and stats.bypassed == bypassed  # all graphed

        caplog.clear()
        long_id = LENGTHS.index(160)
        for _ in range(2):
            assert _generate(llm, [prompts[long_id]]) == [expected[long_id]]
        warnings = [r for r in caplog.records if "was not warmed up" in r.getMessage()]
        assert len(warnings) == 1
        # Outside the buckets the prompt runs unpadded (seed 001), in its own shape.
        assert runner.bucketing.fallback_buckets == [Bucket(1, 160, 0)]
        # The fallback bucket's graph is captured, and its logits gather (a new hidden
        # shape) compiles too: two compiles, once.
        assert (True, Bucket(1, 160, 0)) in runner.graphed_buckets
        assert runner.num_compiles_after_warmup == 2
        assert runner.tracker.compiled_labels[True] == ["prompt (1, 160, 0)", "logits (1,)"]
        assert re.search(r"Step \d+: 2 graph compilation\(s\) \[prompt \(1, 160, 0\): 1, "
                         r"logits \(1,\): 1", caplog.text)
        compile_stats = llm.llm_engine.engine_core.executor.worker.get_compile_stats()
        assert compile_stats["num_compiles_after_warmup"] == 2
        assert compile_stats["execution_mode"] == "HPU graphs"
        release(llm)
