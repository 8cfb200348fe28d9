"""A traced run, a plan from its trace, and a planned run on the fake HPU (HPU graphs):
the planned run compiles nothing after warmup and measures the padding the planner
predicted; a warmup budget leaves buckets cold and says which."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from vllm import SamplingParams
from vllm.hpu.bucket_planner import BucketPlan, default_context, evaluate, make_plan
from vllm.hpu.bucket_trace import read_trace
from vllm.hpu.bucketing import Bucket, HPUBucketingContext
from vllm.hpu.warmup_order import traffic_order

ARGS = dict(max_model_len=256, max_num_seqs=4, block_size=16, kv_cache_memory_bytes=1 << 20,
            enable_prefix_caching=False)
LENGTHS = [5, 70, 12, 33, 100, 8, 47, 21, 64, 3]
BUCKET_ENV = {"VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_PROMPT_SEQ_BUCKET_MAX": "128",
              "VLLM_DECODE_BS_BUCKET_MAX": "4", "PT_HPU_LAZY_MODE": "1"}


def _serve(llm):
    prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
    params = [SamplingParams(temperature=0.0, max_tokens=4 + (i * 7) % 20, ignore_eos=True)
              for i in range(len(prompts))]
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def test_trace_plan_and_planned_run(tiny_model_factory, tmp_path):
    path = tiny_model_factory("llama")
    trace = tmp_path / "trace.jsonl"
    with platform_env("hpu", **BUCKET_ENV, VLLM_BUCKET_TRACE=str(trace)):
        llm = make_llm(model=path, **ARGS)
        try:
            runner = runner_of(llm)
            n_prompt, n_decode = runner.bucketing.num_prompt_buckets, \
                runner.bucketing.num_decode_buckets
            _serve(llm)
            base = llm.llm_engine.get_bucket_stats()
        finally:
            release(llm)
    limits, passes = read_trace(str(trace))
    assert limits.block_size == 16 and limits.max_num_seqs == 4
    assert sum(p.phase == "decode" for p in passes) == base["passes"]["decode"]
    prompt_sets = [p for p in passes if p.phase == "prompt"]
    assert prompt_sets and all(p.is_prompt_set for p in prompt_sets)
    assert sorted(q for p in prompt_sets for q in p.query_lens) == sorted(LENGTHS)
    plan = make_plan(passes, limits, n_prompt, n_decode)
    plan_path = tmp_path / "plan.json"
    plan.save(str(plan_path))
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_BUCKET_PLAN=str(plan_path)):
        llm = make_llm(model=path, **ARGS)
        try:
            runner = runner_of(llm)
            assert runner.bucketing.strategy == "plan"
            _serve(llm)
            stats = llm.llm_engine.get_bucket_stats()
            assert llm.llm_engine.get_compile_stats()["num_compiles_after_warmup"] == 0
        finally:
            release(llm)
    assert stats["num_compiles_after_warmup"] == 0 and stats["fallback_passes"] == 0
    assert stats["warmup_seconds"] > 0 and stats["cold_buckets"] == []
    # The same steps ran, and the planner replayed the runner's own prompt split.
    assert stats["passes"]["prompt"] == sum(plan.prompt_weights)
    for phase in ("prompt", "decode"):
        measured, predicted = stats["padding_waste"][phase], plan.predicted_waste[phase]
        assert measured == pytest.approx(predicted, rel=1e-9, abs=1e-12), phase
        assert measured <= base["padding_waste"][phase] + 1e-9
    assert sum(stats["bucket_hits"].values()) == sum(stats["passes"].values())


def test_warmup_budget_leaves_cold_buckets_logged(tiny_model_factory, caplog):
    path = tiny_model_factory("llama")
    with platform_env("hpu", **BUCKET_ENV, VLLM_WARMUP_BUDGET_S="1e-9"):
        with caplog.at_level("WARNING", logger="vllm"):
            llm = make_llm(model=path, **ARGS)
        try:
            runner = runner_of(llm)
            stats = llm.llm_engine.get_bucket_stats()
            assert stats["cold_buckets"], "a budget spent at once leaves buckets cold"
            assert "Warmup budget VLLM_WARMUP_BUDGET_S" in caplog.text
            # Only the first (smallest) bucket was compiled before the check; cold buckets
            # that a warm one covers were dropped from the lookup.
            assert runner.tracker.num_compiles_warmup > 0
        finally:
            release(llm)


def test_warmup_budget_warms_the_busiest_buckets_first(tiny_model_factory, tmp_path):
    """With a plan, the buckets that carried the most trace passes are warmed first:
    a budget that allows only part of the warmup leaves the rarely used ones cold,
    and a cold bucket covered by a warm one is dropped from the lookup."""
    plan = BucketPlan(16, [Bucket(1, 16, 0), Bucket(2, 128, 0)],
                      [Bucket(1, 1, 4), Bucket(4, 1, 64)], prompt_weights=[10, 1],
                      decode_weights=[20, 1])
    plan.save(str(tmp_path / "plan.json"))
    path = tiny_model_factory("llama")
    with platform_env("hpu", VLLM_BUCKET_PLAN=str(tmp_path / "plan.json")):
        llm = make_llm(model=path, **ARGS)
        runner = runner_of(llm)
        try:
            ops = runner.warmup_ops()
        finally:
            release(llm)
    order = traffic_order(ops.prompt_buckets, ops.decode_buckets, 16, ops.prompt_traffic,
                          ops.decode_traffic)
    assert order[:2] == [(False, Bucket(1, 1, 4)), (True, Bucket(1, 16, 0))]
    assert set(order[2:]) == {(True, Bucket(2, 128, 0)), (False, Bucket(4, 1, 64))}
    ctx = HPUBucketingContext(4, None, 16, 256, 256, num_kv_blocks=64,
                              use_prompt_context=False, strategy="plan", plan=plan)
    assert ctx.drop_cold_bucket(True, Bucket(1, 16, 0), {Bucket(1, 16, 0)})
    assert not ctx.drop_cold_bucket(True, Bucket(2, 128, 0), {Bucket(2, 128, 0)})
    assert ctx.find_prompt_bucket(1, 10) == Bucket(2, 128, 0)



def _serve_shared_prefixes(llm) -> None:
    """Prompts sharing three prefixes, three requests at a time: later ones hit the
    prefix cache, so their prompt passes have context blocks."""
    tok = llm.get_tokenizer()
    base = ragged_prompt_ids(tok, [40, 70, 100])
    tails = ragged_prompt_ids(tok, [5, 12, 33, 21, 8, 47, 3, 64], seed=1)
    prompts = [base[i % 3] + t for i, t in enumerate(tails)] + base
    params = [SamplingParams(temperature=0.0, max_tokens=3 + (i * 5) % 9, ignore_eos=True)
              for i in range(len(prompts))]
    for i in range(0, len(prompts), 3):
        llm.generate([{"prompt_token_ids": p} for p in prompts[i:i + 3]], params[i:i + 3],
                     use_tqdm=False)


def test_prefix_caching_trace_replays_the_server_and_its_plan_is_served_exactly(
        tiny_model_factory, tmp_path, caplog):
    """Issue 54, items 2 and 3, with prefix caching on (the default).

    Before: the planner's baseline modelled the grid without context buckets (here 24
    prompt buckets where the server had 135), replayed cache hits into fallback
    buckets it warned about (the server had none) and predicted 38.1% prompt waste
    where the server measured 28.9%; a plan of N prompt buckets then became several
    times N on the server, which added context variants of each.
    Now the trace carries the server's grid, the replay pads cached prefixes as the
    server did, and a plan's buckets (context included) are exactly what the server
    warms; the waste predicted for each run is what it measured."""
    path = tiny_model_factory("llama")
    trace = tmp_path / "trace.jsonl"
    args = {**ARGS, "enable_prefix_caching": True}
    env = {k: v for k, v in BUCKET_ENV.items() if k != "VLLM_PROMPT_SEQ_BUCKET_MAX"}
    with platform_env("hpu", **env, VLLM_BUCKET_TRACE=str(trace)):
        llm = make_llm(model=path, **args)
        try:
            runner = runner_of(llm)
            served = (runner.bucketing.num_prompt_buckets, runner.bucketing.num_decode_buckets)
            _serve_shared_prefixes(llm)
            measured = llm.llm_engine.get_bucket_stats()
            assert llm.llm_engine.get_stats().prefix_cache_hits > 0
        finally:
            release(llm)
    assert measured["fallback_passes"] == 0
    limits, passes = read_trace(str(trace))
    assert limits.use_prompt_context and limits.num_kv_blocks
    assert any(c for p in passes if p.phase == "prompt" for c in p.ctx_blocks)
    base = default_context(limits)
    assert (base.num_prompt_buckets, base.num_decode_buckets) == served
    with caplog.at_level("WARNING", logger="vllm"):
        ev = evaluate(base, passes)
    assert ev.fallbacks == 0 and "was not warmed up" not in caplog.text
    for phase in ("prompt", "decode"):
        assert abs(ev.waste[phase] - measured["padding_waste"][phase]) < 0.01, phase
    assert ev.passes == measured["passes"]

    plan = make_plan(passes, limits, 16, 12)
    assert plan.use_prompt_context and len(plan.prompt_buckets) <= 16
    assert any(b.num_blocks for b in plan.prompt_buckets)
    plan_path = tmp_path / "plan.json"
    plan.save(str(plan_path))
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_BUCKET_PLAN=str(plan_path)):
        llm = make_llm(model=path, **args)
        try:
            runner = runner_of(llm)
            assert sorted(runner.bucketing.prompt_buckets) == sorted(plan.prompt_buckets)
            assert sorted(runner.bucketing.decode_buckets) == sorted(plan.decode_buckets)
            _serve_shared_prefixes(llm)
            stats = llm.llm_engine.get_bucket_stats()
        finally:
            release(llm)
    assert stats["num_compiles_after_warmup"] == 0 and stats["fallback_passes"] == 0
    for phase in ("prompt", "decode"):
        assert abs(stats["padding_waste"][phase] - plan.predicted_waste[phase]) < 0.01, phase
