"""The runner's split of a step's prompts into passes (prompt_grouping.py), the trace
of prompt sets it records, and the planner's replay of that split: no model."""
from __future__ import annotations

import itertools
import json
import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.hpu.bucket_accounting import BucketAccounting
from vllm.hpu.bucket_planner import BucketPlan, evaluate, make_plan, plan_context
from vllm.hpu.bucket_trace import TRACE_FORMAT, EngineLimits, TracePass, read_trace, simulate
from vllm.hpu.bucketing import Bucket, HPUBucketingContext
from vllm.hpu.input_prep import PromptSeq
from vllm.hpu.model_runner import HPUModelRunner
from vllm.hpu.padding_cost import prompt_cost
from vllm.hpu.prompt_grouping import (PROMPT_PASS_OVERHEAD_TOKENS, PromptShape,
                                      greedy_group_prompts, group_prompts,
                                      resolve_pass_overhead)

BS = 128


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("VLLM_BUCKETING_STRATEGY", "VLLM_BUCKET_PLAN", "VLLM_BUCKET_TRACE",
                 "VLLM_PROMPT_PASS_OVERHEAD_TOKENS", "VLLM_EXPONENTIAL_BUCKETING"):
        monkeypatch.delenv(name, raising=False)


def _covering(buckets):
    def covering(b, q, c):
        fits = [x for x in buckets if x.batch_size >= b and x.query_len >= q
                and x.num_blocks >= c]
        return min(fits, key=lambda x: (prompt_cost(*x, BS), x)) if fits else None
    return covering


def _cost(groups, covering, overhead):
    total = 0
    for g in groups:
        b = covering(len(g), max(s.query_len for s in g), max(s.num_context_blocks for s in g))
        if b is None:
            assert len(g) == 1, "only a lone prompt may lack a covering bucket"
            b = Bucket(1, g[0].query_len, g[0].num_context_blocks)
        total += prompt_cost(*b, BS) + overhead
    return total


def _shapes(groups):
    return [[s.query_len for s in g] for g in groups]


def test_long_and_short_prompts_split_into_two_passes():
    buckets = [Bucket(1, 1024, 0), Bucket(2, 1024, 0), Bucket(4, 1024, 0), Bucket(2, 16, 0)]
    prompts = [PromptShape(q, 0) for q in (10, 1000, 10, 1000)]
    groups = group_prompts(prompts, _covering(buckets), BS, overhead=128)
    # One pass pads the two short prompts to 1024: 4096 + 128 against 2048 + 32 + 256.
    assert _shapes(groups) == [[1000, 1000], [10, 10]]
    assert _shapes(greedy_group_prompts(prompts, _covering(buckets))) == [[1000, 1000, 10, 10]]
    # A pass that costs more than the padding it saves keeps them together.
    assert _shapes(group_prompts(prompts, _covering(buckets), BS, overhead=5000)) == \
        [[1000, 1000, 10, 10]]


def test_split_is_the_least_cost_contiguous_partition():
    rng = random.Random(0)
    for _ in range(60):
        buckets = list({Bucket(rng.choice([1, 2, 3, 4]), rng.choice([16, 64, 256, 1024]),
                               rng.choice([0, 0, 1, 2])) for _ in range(rng.randint(1, 7))})
        covering = _covering(buckets)
        prompts = [PromptShape(rng.randint(1, 1100), rng.choice([0, 0, 1, 2, 3]))
                   for _ in range(rng.randint(1, 7))]
        overhead = rng.choice([0, 64, 128, 2000])
        groups = group_prompts(prompts, covering, BS, overhead)
        assert sorted(s for g in groups for s in g) == sorted(prompts)
        best = _cost(groups, covering, overhead)  # also: uncovered groups are lone prompts
        ordered = sorted(prompts, key=lambda s: (s.num_context_blocks, s.query_len),
                         reverse=True)
        brute = float("inf")
        for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
            parts, start = [], 0
            for k, cut in enumerate(cuts, start=1):
                if cut:
                    parts.append(ordered[start:k])
                    start = k
            parts.append(ordered[start:])
            try:
                brute = min(brute, _cost(parts, covering, overhead))
            except AssertionError:
                continue  # an uncovered run of several prompts is not a valid split
        assert best == brute, (buckets, prompts, overhead)
        assert best <= _cost(greedy_group_prompts(prompts, covering), covering, overhead)


def _seq(req, blocks, context_tokens, n):
    pos = np.arange(context_tokens, context_tokens + n)
    slots = np.asarray(blocks)[pos // BS] * BS + pos % BS
    return PromptSeq(req, np.arange(n) + 1, pos, slots, context_tokens,
                     blocks[:-(-context_tokens // BS)], sample=True)


def _fake_runner(ctx):
    """What `HPUModelRunner._make_batches` reads, without a model."""
    return SimpleNamespace(block_size=BS, bucketing=ctx, pad_block_id=63,
                           accounting=BucketAccounting(ctx), device=torch.device("cpu"),
                           prompt_pass_overhead=resolve_pass_overhead(ctx.plan),
                           contiguous_pa=True, dtype=torch.float32,
                           _bidirectional_mm=False)


def test_runner_passes_keep_writers_first_and_trace_replays_exactly(tmp_path, monkeypatch):
    """The runner's own batching: passes fit warmed buckets, a prompt reading a block
    written this step runs after its writer's pass, and the trace it records replays
    (planner side) to exactly the padding it measured."""
    trace = tmp_path / "t.jsonl"
    monkeypatch.setenv("VLLM_BUCKET_TRACE", str(trace))
    ctx = HPUBucketingContext(8, None, BS, 2048, 2048, num_kv_blocks=64,
                              use_prompt_context=True, strategy="exp")
    runner = _fake_runner(ctx)
    writer = _seq("w", [1, 2, 3], 0, 300)           # writes blocks 1-3
    reader = _seq("r", [1, 2, 9], 256, 20)          # reads blocks 1, 2: after "w"
    others = [_seq(f"s{i}", list(range(10 + 8 * i, 18 + 8 * i)), 0, n)
              for i, n in enumerate([900, 700, 12, 30, 5])]
    batches = HPUModelRunner._make_batches(runner, [reader, *others, writer], [])
    order = [s.req_id for b in batches for s in b.seqs]
    assert sorted(order) == sorted(["w", "r"] + [f"s{i}" for i in range(5)])
    pass_of = {s.req_id: k for k, b in enumerate(batches) for s in b.seqs}
    assert pass_of["r"] > pass_of["w"]
    assert batches[-1].seqs == [reader]  # the second dependency level
    for b in batches:
        assert b.bucket in ctx.prompt_buckets and b.bucket not in ctx.fallback_buckets
    measured = runner.accounting.stats()
    runner.accounting.close()
    limits, lines = read_trace(str(trace))
    assert [line.is_prompt_set for line in lines] == [True, True]
    assert sorted(lines[0].query_lens) == [5, 12, 30, 300, 700, 900]
    assert lines[1].query_lens == (20,) and lines[1].ctx_blocks == (2,)
    replay = evaluate(HPUBucketingContext(8, None, BS, 2048, 2048, num_kv_blocks=64,
                                          use_prompt_context=True, strategy="exp"), lines)
    assert replay.padded["prompt"] == measured["padded_tokens"]["prompt"]
    assert replay.real["prompt"] == measured["real_tokens"]["prompt"]
    assert replay.passes["prompt"] == len(batches) == measured["passes"]["prompt"]
    assert limits.max_num_seqs == 8


def test_trace_round_trips_prompt_sets_and_reads_version_1(tmp_path):
    from vllm.hpu.bucket_trace import TraceRecorder
    limits = EngineLimits(BS, 8, 2048, 2048)
    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(str(path), limits)
    rec.record(TracePass.prompt_set([100, 7, 40], [0, 2, 0], BS))
    rec.record(TracePass("decode", 2, 1, 3))
    rec.close()
    got_limits, (prompts, decode) = read_trace(str(path))
    assert got_limits == limits
    assert prompts.query_lens == (100, 7, 40) and prompts.ctx_blocks == (0, 2, 0)
    assert (prompts.batch_size, prompts.query_len, prompts.num_blocks) == (3, 100, 2)
    assert prompts.real_tokens == 147 + 2 * BS and not decode.is_prompt_set
    assert "query_lens" not in path.read_text().splitlines()[2]  # decodes stay short
    with pytest.raises(ValueError, match="query_lens"):
        TracePass("prompt", 2, 100, 0, 0, (100,), (0,))
    # A version-1 trace: one line per pass as it ran, replayed as it is.
    old = tmp_path / "v1.jsonl"
    old.write_text("\n".join(json.dumps(x) for x in (
        {"format": TRACE_FORMAT, "version": 1, "block_size": BS, "max_num_seqs": 8,
         "max_num_batched_tokens": 2048, "max_model_len": 2048},
        {"phase": "prompt", "batch_size": 2, "query_len": 100, "num_blocks": 0,
         "real_tokens": 150},
        {"phase": "decode", "batch_size": 2, "query_len": 1, "num_blocks": 3})) + "\n")
    got_limits, lines = read_trace(str(old))
    assert got_limits == limits and not lines[0].is_prompt_set
    ctx = HPUBucketingContext(8, None, BS, 2048, 2048, num_kv_blocks=64,
                              use_prompt_context=False, strategy="exp")
    ev = evaluate(ctx, lines)
    assert ev.passes == {"prompt": 1, "decode": 1}
    assert ev.padded["prompt"] == prompt_cost(*ctx.find_prompt_bucket(2, 100), BS)


def test_simulated_trace_carries_prompt_sets_and_plan_predicts_its_replay():
    limits = EngineLimits(BS, 32, 2048, 2048)
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(130 * np.exp(rng.standard_normal(200))), 4, 1500).astype(int)
    passes = simulate([(int(p), 20) for p in lengths], limits)
    prompt_lines = [p for p in passes if p.phase == "prompt"]
    assert all(p.is_prompt_set for p in prompt_lines)
    assert sorted(q for p in prompt_lines for q in p.query_lens) == sorted(lengths.tolist())
    plan = make_plan(passes, limits, 8, 8, overhead=64)
    assert plan.prompt_pass_overhead == 64
    ev = evaluate(plan_context(plan, limits), passes, overhead=64)
    assert ev.waste == pytest.approx(plan.predicted_waste, abs=0)
    assert sum(plan.prompt_weights) == ev.passes["prompt"] > len(prompt_lines)
    # Its own split beats the former greedy one on the same buckets.
    greedy = evaluate(plan_context(plan, limits), passes, overhead=64,
                      grouping=greedy_group_prompts)
    assert ev.prompt_objective <= greedy.prompt_objective


def test_overhead_knob_and_plan_value(monkeypatch, caplog):
    assert resolve_pass_overhead() == PROMPT_PASS_OVERHEAD_TOKENS
    plan = BucketPlan(BS, [Bucket(1, 128, 0)], [Bucket(1, 1, 4)], prompt_pass_overhead=300)
    assert resolve_pass_overhead(plan) == 300
    monkeypatch.setenv("VLLM_PROMPT_PASS_OVERHEAD_TOKENS", "50")
    assert resolve_pass_overhead() == 50
    with caplog.at_level(logging.WARNING, logger="vllm"):
        assert resolve_pass_overhead(plan) == 50
    assert "overrides the bucket plan's 300" in caplog.text
    monkeypatch.setenv("VLLM_PROMPT_PASS_OVERHEAD_TOKENS", "-1")
    with pytest.raises(ValueError, match="VLLM_PROMPT_PASS_OVERHEAD_TOKENS"):
        resolve_pass_overhead()
