"""Execution modes and the HPU graph memory budget, on a tiny random Llama."""
from __future__ import annotations

import logging

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from vllm import SamplingParams
from vllm.hpu import habana
from vllm.hpu.bucketing import Bucket

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, " * 12,
           "Water boils at", "List three colors:"]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TINY = dict(max_num_seqs=4, kv_cache_memory_bytes=4 << 20)


def _generate(llm, prompts):
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        llm = make_llm(model=path, **TINY)
        expected = _generate(llm, PROMPTS)
        release(llm)
    return path, expected


@pytest.mark.parametrize("lazy,eager,mode", [
    ("1", False, "HPU graphs"), ("1", True, "lazy"), ("0", False, "torch.compile"),
    ("0", True, "eager")])
def test_execution_modes_match_cpu_and_compile_nothing_after_warmup(tiny, lazy, eager, mode,
                                                                   monkeypatch):
    path, expected = tiny
    import torch._dynamo.utils as dynamo_utils
    from vllm.hpu.habana.fake_compile import OutputSpec
    skipped = []  # region outputs returned as traced-shape zeros instead of computed
    materialize = OutputSpec.materialize
    monkeypatch.setattr(OutputSpec, "materialize",
                        lambda spec, args: skipped.append(spec) or materialize(spec, args))
    with platform_env("hpu", PT_HPU_LAZY_MODE=lazy, **SMALL_BUCKETS):
        llm = make_llm(model=path, enforce_eager=eager, **TINY)
        runner = runner_of(llm)
        assert runner.mode.value == mode
        dynamo_graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        # Only the fake HPU's torch.compile warmup skips the regions' arithmetic.
        assert bool(skipped) == (mode == "torch.compile")
        skipped_in_warmup = len(skipped)
        assert _generate(llm, PROMPTS) == expected
        assert len(skipped) == skipped_in_warmup  # serving computes every region
        assert runner.num_compiles_after_warmup == 0
        assert runner.bucketing.fallback_buckets == []
        if mode == "torch.compile":
            assert dynamo_graphs > 0  # regions were compiled during warmup ...
            # ... and serving inside the warmed buckets traced nothing new.
            assert dynamo_utils.counters["stats"]["unique_graphs"] == dynamo_graphs
        if mode == "HPU graphs":
            assert len(runner.graphed_buckets) == (runner.bucketing.num_prompt_buckets +
                                                   runner.bucketing.num_decode_buckets)
        release(llm)


def test_graphs_that_do_not_fit_run_without_a_graph(tiny, caplog):
    """Capture within a small graph budget: what does not fit is skipped (and runs
    eagerly, with the same output); memory left by decode goes back to prompts."""
    path, expected = tiny
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1", VLLM_SKIP_WARMUP="1",
               VLLM_GRAPH_PROMPT_RATIO="0.5")
    with platform_env("hpu", **env), caplog.at_level(logging.INFO, logger="vllm"):
        llm = make_llm(model=path, enable_prefix_caching=False, **TINY)
        runner = runner_of(llm)
        assert runner.graphed_buckets == set()
        # hidden size 64, fp32: a graph keeps 256 bytes of output per token, so
        # prompt (1, 128) takes 32 KiB and (2, 128) 64 KiB; decode graphs take < 2 KiB.
        graph_budget = 80 << 10
        runner.mem_margin = habana.mem_get_info()[0] - graph_budget
        runner.warmup_model()
        prompt_graphs = {b for p, b in runner.graphed_buckets if p}
        decode_graphs = {b for p, b in runner.graphed_buckets if not p}
        assert prompt_graphs == {Bucket(1, 128, 0)}
        assert decode_graphs == set(runner.bucketing.decode_buckets)
        assert "Graph/Prompt not captured (no graph memory left; they run without a graph): " \
               "[(2, 128, 0)]" in caplog.text
        stats = habana.graph_stats(runner.forward_module)
        bypassed = stats.bypassed
        assert _generate(llm, PROMPTS) == expected  # pairs of prompts use (2, 128, 0)
        assert stats.bypassed > bypassed
        release(llm)


def test_logprobs_prompt_logprobs_and_seeded_sampling_match_cpu(tiny_model_factory):
    """The runner's other outputs follow the CPU runner's contract and values."""
    path = tiny_model_factory("llama")
    params = [SamplingParams(temperature=0, max_tokens=4, logprobs=3, prompt_logprobs=2),
              SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=6),
              SamplingParams(temperature=0, max_tokens=3, logprobs=1)]
    prompts = PROMPTS[:3]

    def run():
        llm = make_llm(model=path, **TINY)
        outs = llm.generate(prompts, params, use_tqdm=False)
        release(llm)
        return outs

    with platform_env("cpu"):
        cpu = run()
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", **SMALL_BUCKETS):
        fake_hpu = run()
    for a, b in zip(cpu, fake_hpu):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        if a.outputs[0].logprobs is not None:
            for step_a, step_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
                assert step_a.keys() == step_b.keys()
                for tok in step_a:
                    assert step_a[tok].logprob == pytest.approx(step_b[tok].logprob, abs=1e-4)
    pa, pb = cpu[0].prompt_logprobs, fake_hpu[0].prompt_logprobs
    assert pa is not None and len(pa) == len(pb) == len(cpu[0].prompt_token_ids)
    for step_a, step_b in zip(pa[1:], pb[1:]):
        assert step_a.keys() == step_b.keys()
        for tok in step_a:
            assert step_a[tok].logprob == pytest.approx(step_b[tok].logprob, abs=1e-4)


def test_tensor_parallel_with_hpu_graphs(tiny):
    """Two spawned TP ranks (gloo on the fake HPU) warm up, capture and serve in step."""
    path, expected = tiny
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", **SMALL_BUCKETS):
        llm = make_llm(model=path, tensor_parallel_size=2, distributed_executor_backend="mp",
                       **TINY)
        assert _generate(llm, PROMPTS) == expected
        stats = llm.llm_engine.engine_core.executor.collective_rpc("get_compile_stats")
        assert [s["num_compiles_after_warmup"] for s in stats] == [0, 0]
        assert all(s["num_graphed_buckets"] > 0 for s in stats)
        release(llm)
