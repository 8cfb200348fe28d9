"""Every compile of a step is bucketed, warmed and counted (fake HPU, HPU graphs):
after warmup a mixed workload compiles nothing (penalties, logit_bias, min_tokens and
allowed_token_ids included), VLLM_SKIP_WARMUP still serves through captured graphs, and a fallback bucket
beyond the warmed range is captured."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import (SMALL_BUCKETS, make_llm, platform_env, ragged_prompt_ids,
                                release, runner_of)
from vllm import SamplingParams
from vllm.hpu import habana

LENGTHS = [3, 17, 40, 90, 120, 60, 33]
ARGS = dict(max_model_len=512, max_num_seqs=4, block_size=16, kv_cache_memory_bytes=1 << 20)


def _mixed_params() -> list[SamplingParams]:
    """Greedy, n > 1, logprobs (small and the maximum), prompt logprobs, seeded
    sampling with top-k / top-p / min-p; outputs of different lengths so requests
    leave at different steps (holes in the KV cache)."""
    return [SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
            SamplingParams(temperature=0.8, n=2, seed=3, max_tokens=5, ignore_eos=True),
            SamplingParams(temperature=0.0, logprobs=3, prompt_logprobs=2, max_tokens=12,
                           ignore_eos=True),
            SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=5, max_tokens=3,
                           ignore_eos=True),
            SamplingParams(temperature=0.7, min_p=0.05, logprobs=20, prompt_logprobs=0,
                           max_tokens=7, ignore_eos=True),
            SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
            SamplingParams(temperature=0.9, seed=11, max_tokens=10, ignore_eos=True)]


def _processed_params() -> list[SamplingParams]:
    """Every logits processor of the sampler (issue: 2 compiles for penalties, 1 for
    logit_bias, 1 for min_tokens after warmup)."""
    return [SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3,
                           max_tokens=4, ignore_eos=True),
            SamplingParams(temperature=0.8, seed=7, repetition_penalty=1.2,
                           logit_bias={5: 3.0, 9: -2.0}, max_tokens=3, ignore_eos=True),
            SamplingParams(temperature=0.0, min_tokens=3, max_tokens=5,
                           bad_words=["the cat", "x"]),
            SamplingParams(temperature=0.0, allowed_token_ids=list(range(10, 60)),
                           logprobs=2, max_tokens=3, ignore_eos=True)]


def _run(llm, prompts, params):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["defrag", "prefix_hits"])
def test_mixed_workload_compiles_nothing_after_warmup(tiny_model_factory, prefix_caching):
    path = tiny_model_factory("llama")
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1", VLLM_DEFRAG_THRESHOLD="0")
    with platform_env("hpu", **env):
        llm = make_llm(model=path, enable_prefix_caching=prefix_caching, **ARGS)
        try:
            runner = runner_of(llm)
            tracker = runner.tracker
            warmed = " ".join(tracker.compiled_labels[False])
            for kind in ("prompt", "decode", "logits", "argmax", "sampler",
                         "prompt logprobs gather", "prompt logprobs", "bitmask"):
                assert kind + " " in warmed, kind
            assert ("defrag swap" in warmed) == (not prefix_caching)
            prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
            seen = []
            make_batches = runner._make_batches
            runner._make_batches = lambda p, d: _record(seen, make_batches(p, d))
            first = _run(llm, prompts, _mixed_params())
            second = _run(llm, prompts[::-1], _mixed_params()[::-1])
            assert all(len(o.outputs) == p.n for o, p in zip(first, _mixed_params()))
            assert first[2].prompt_logprobs is not None and second[4].outputs[0].logprobs
            if prefix_caching:
                assert any(b.is_prompt and b.bucket.num_blocks > 0 for b in seen)
            else:
                assert runner.defragmenter.total_moves > 0
            assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
            assert runner.bucketing.fallback_buckets == []
            assert runner.num_graph_replays > 0
            if prefix_caching:
                # Penalties, logit_bias, min_tokens, bad_words (a mask rebuilt per step)
                # and allowed_token_ids, alone and together, greedy and seeded, batch
                # sizes 1-4: the sampler's one full shape per bucket, warmed, so nothing
                # compiles.
                _run(llm, prompts[:4], _processed_params())
                _run(llm, prompts[:1], _processed_params()[:1])
                _run(llm, prompts[1:3], _processed_params()[2:])
                assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
            else:
                # Beyond the warmed prompt range (seq max 128): a fallback bucket, captured.
                captures = habana.graph_stats(runner.forward_module).captures
                bypassed = habana.graph_stats(runner.forward_module).bypassed
                long_prompt = ragged_prompt_ids(llm.get_tokenizer(), [200])
                _run(llm, long_prompt, [SamplingParams(temperature=0.0, max_tokens=2)])
                fallback = [b for b in runner.bucketing.fallback_buckets if b.query_len > 1]
                assert fallback and (True, fallback[0]) in runner.graphed_buckets
                assert habana.graph_stats(runner.forward_module).captures > captures
                assert habana.graph_stats(runner.forward_module).bypassed == bypassed
        finally:
            release(llm)


def _record(seen: list, batches: list) -> list:
    seen.extend(batches)
    return batches


def test_skip_warmup_keeps_hpu_graphs(tiny_model_factory):
    path = tiny_model_factory("llama")
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_SKIP_WARMUP="true", **SMALL_BUCKETS):
        llm = make_llm(model=path, **ARGS)
        try:
            runner = runner_of(llm)
            assert runner.graphed_buckets == set()
            graphs = habana.graph_stats(runner.forward_module)
            bypassed = graphs.bypassed  # the profile run (no KV cache yet)
            prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS[:4])
            _run(llm, prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
            assert graphs.bypassed == bypassed  # every serving pass went through a graph
            assert runner.num_graph_captures == graphs.captures > 0
            assert runner.num_graph_replays == graphs.replays > 0
            stats = runner.get_compile_stats()
            assert stats["num_graph_captures"] == graphs.captures
            assert stats["num_graphed_buckets"] == len(runner.graphed_buckets) > 0
            # Captures on first use are compiles after (skipped) warmup, and counted.
            assert stats["num_compiles_after_warmup"] >= graphs.captures
        finally:
            release(llm)
