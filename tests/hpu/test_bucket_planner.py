"""The bucket planner: exact DPs on crafted traces, plan files, strategies, the CLI."""
from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from vllm.hpu.bucket_planner import (BucketPlan, default_context, evaluate, ladder_costs,
                                     ladder_values, load_plan, make_plan, plan_phase,
                                     prompt_group_cost, decode_group_cost,
                                     geometric_candidates)
from vllm.hpu.bucket_trace import EngineLimits, TracePass, read_trace, simulate
from vllm.hpu.bucketing import Bucket, HPUBucketingContext, pad_range, resolve_strategy

STRATEGY_VARS = ["VLLM_BUCKETING_STRATEGY", "VLLM_BUCKET_PLAN", "VLLM_EXPONENTIAL_BUCKETING"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in STRATEGY_VARS:
        monkeypatch.delenv(name, raising=False)


def _brute_ladder(values, counts, k):
    """Least sum(count * covering value) over every ladder of <= k data values."""
    best = float("inf")
    for r in range(1, k + 1):
        for ladder in itertools.combinations(values, r):
            if ladder[-1] != values[-1]:
                continue
            best = min(best, sum(c * next(b for b in ladder if b >= v)
                                 for v, c in zip(values, counts)))
    return best


def test_ladder_known_optimum():
    values, counts = np.array([1, 2, 3, 10]), np.array([1, 1, 1, 1])
    costs, choices = ladder_costs(values, counts, 3)
    # k=1: all in 10 (40); k=2: {3, 10} (3*3 + 10 = 19); k=3: {1, 3, 10} or {2, 3, 10} (17)
    assert costs.tolist() == [40, 19, 17]
    assert ladder_values(values, choices, 2) == [3, 10]
    assert ladder_values(values, choices, 3) in ([1, 3, 10], [2, 3, 10])


def test_ladder_matches_brute_force_on_random_traces():
    rng = random.Random(0)
    for _ in range(40):
        n = rng.randint(1, 7)
        values = sorted(rng.sample(range(1, 60), n))
        counts = [rng.randint(0, 9) for _ in values]
        costs, choices = ladder_costs(np.array(values), np.array(counts), 4)
        for k in range(1, 5):
            assert costs[k - 1] == _brute_ladder(values, counts, k), (values, counts, k)
            ladder = ladder_values(np.array(values), choices, k)
            assert len(ladder) <= k and ladder[-1] == values[-1]
            assert sum(c * next(b for b in ladder if b >= v)
                       for v, c in zip(values, counts)) == costs[k - 1]


def test_plan_phase_two_clusters_need_no_grid():
    """Long lone prompts and short batched ones: 2 buckets suffice, a grid needs 4."""
    points = {(1, 1000): 10, (8, 100): 10}
    plan = plan_phase(points, 2, prompt_group_cost)
    assert plan.buckets == [(1, 1000), (8, 100)]
    assert plan.cost == 10 * 1000 + 10 * 800
    one = plan_phase(points, 1, prompt_group_cost)
    assert one.buckets == [(8, 1000)] and one.cost == 20 * 8000


def test_plan_phase_beats_or_ties_every_grid():
    """The DP's family contains every grid, so no grid of <= K buckets is cheaper."""
    rng = random.Random(1)
    for _ in range(15):
        points = {(rng.choice([1, 2, 3, 5]), rng.choice([10, 20, 35, 50])): rng.randint(1, 5)
                  for _ in range(6)}
        bs = sorted({b for b, _ in points})
        ls = sorted({v for _, v in points})
        K = rng.randint(1, 6)
        plan = plan_phase(points, K, prompt_group_cost)
        assert len(plan.buckets) <= K
        for nb in range(1, len(bs) + 1):
            for nl in range(1, len(ls) + 1):
                if nb * nl > K:
                    continue
                for B in itertools.combinations(bs, nb):
                    for L in itertools.combinations(ls, nl):
                        if B[-1] != bs[-1] or L[-1] != ls[-1]:
                            continue
                        grid = sum(c * next(x for x in B if x >= b) *
                                   next(y for y in L if y >= v)
                                   for (b, v), c in points.items())
                        assert plan.cost <= grid


def test_decode_cost_counts_rows_and_blocks():
    points = {(4, 10): 3, (4, 12): 1}
    plan = plan_phase(points, 1, decode_group_cost(block_size=16, row_weight=100))
    assert plan.buckets == [(4, 12)]
    assert plan.cost == 4 * (4 * 100 + 12 * 16)


def test_zero_count_points_are_covered():
    plan = plan_phase({(1, 10): 5, (4, 50): 0}, 2, prompt_group_cost)
    assert plan.buckets == [(1, 10), (4, 50)] and plan.cost == 50


def test_geometric_candidates_bound():
    values = list(range(1, 1001))
    cand, r = geometric_candidates(values, 40)
    assert len(cand) <= 41 and cand[-1] == 1000
    for v in values:
        assert next(c for c in cand if c >= v) <= v * r + 1e-9


LIMITS = EngineLimits(block_size=128, max_num_seqs=32, max_num_batched_tokens=2048,
                      max_model_len=2048)


def _synthetic_passes(n=300, seed=0):
    rng = np.random.default_rng(seed)
    prompts = np.clip(np.rint(130 * np.exp(rng.standard_normal(n))), 4, 1500).astype(int)
    outputs = np.clip(np.rint(135 * np.exp(0.9 * rng.standard_normal(n))), 4, 400).astype(int)
    return simulate(list(zip(prompts.tolist(), outputs.tolist())), LIMITS)


def test_simulate_respects_limits():
    passes = _synthetic_passes(120)
    assert all(p.batch_size <= LIMITS.max_num_seqs for p in passes)
    prompts = [p for p in passes if p.phase == "prompt"]
    assert sum(p.batch_size for p in prompts) == 120
    assert all(p.real_tokens <= LIMITS.max_num_batched_tokens for p in prompts)


def test_plan_halves_the_exponential_waste_at_the_same_bucket_count():
    passes = _synthetic_passes()
    base = default_context(LIMITS)
    n_p, n_d = base.num_prompt_buckets, base.num_decode_buckets
    base_ev = evaluate(base, passes)
    plan = make_plan(passes, LIMITS, n_p, n_d)
    assert len(plan.prompt_buckets) <= n_p and len(plan.decode_buckets) <= n_d
    ev = evaluate(HPUBucketingContext(32, None, 128, 2048, 2048, num_kv_blocks=512,
                                      use_prompt_context=False, strategy="plan", plan=plan),
                  passes)
    assert ev.fallbacks == 0
    assert ev.waste == pytest.approx(plan.predicted_waste)
    assert ev.rounding_waste["prompt"] <= base_ev.rounding_waste["prompt"] / 2
    assert ev.waste["decode"] <= base_ev.waste["decode"] / 2
    # Both replays split each step's prompts the runner's way (prompt_grouping.py).
    assert ev.waste["prompt"] <= base_ev.waste["prompt"] / 2
    assert sum(plan.prompt_weights) == ev.passes["prompt"]


def test_plan_file_round_trip_and_strategy(tmp_path, monkeypatch):
    plan = make_plan(_synthetic_passes(60), LIMITS, 4, 6)
    path = tmp_path / "plan.json"
    plan.save(str(path))
    loaded = load_plan(str(path))
    assert loaded.prompt_buckets == plan.prompt_buckets
    monkeypatch.setenv("VLLM_BUCKET_PLAN", str(path))
    assert resolve_strategy() == "plan"
    ctx = HPUBucketingContext(32, None, 128, 2048, 2048, num_kv_blocks=10_000,
                              use_prompt_context=False)
    assert ctx.strategy == "plan" and ctx.prompt_buckets == sorted(plan.prompt_buckets)
    ctx.generate_decode_buckets(10_000)
    assert ctx.decode_buckets == sorted(plan.decode_buckets)
    with pytest.raises(ValueError, match="block_size"):
        HPUBucketingContext(32, None, 64, 2048, 2048)
    path.write_text(json.dumps({"format": "something"}))
    with pytest.raises(ValueError, match="VLLM_BUCKET_PLAN"):
        load_plan(str(path))


def test_plan_with_prompt_context_adds_context_buckets():
    plan = BucketPlan(128, [Bucket(1, 256, 0)], [Bucket(1, 1, 4)])
    ctx = HPUBucketingContext(8, None, 128, 2048, 1024, use_prompt_context=True,
                              strategy="plan", plan=plan)
    assert Bucket(1, 256, 0) in ctx.prompt_buckets
    assert any(b.num_blocks > 0 for b in ctx.prompt_buckets)
    assert ctx.covering_prompt_bucket(1, 200, 3) is not None


def test_strategy_knobs(monkeypatch):
    monkeypatch.setenv("VLLM_EXPONENTIAL_BUCKETING", "false")
    assert resolve_strategy() == "lin"
    monkeypatch.setenv("VLLM_BUCKETING_STRATEGY", "pad")
    assert resolve_strategy() == "pad"
    monkeypatch.setenv("VLLM_BUCKETING_STRATEGY", "plan")
    with pytest.raises(ValueError, match="VLLM_BUCKET_PLAN"):
        HPUBucketingContext(8, None, 128, 2048, 1024)
    monkeypatch.setenv("VLLM_BUCKETING_STRATEGY", "fancy")
    with pytest.raises(ValueError, match="VLLM_BUCKETING_STRATEGY"):
        resolve_strategy()


def test_pad_strategy_caps_padding(monkeypatch):
    assert pad_range(128, 128, 2048, 512, 25) == [128, 256, 384, 512, 640, 768, 896, 1024,
                                                  1280, 1536, 1920, 2048]
    monkeypatch.setenv("VLLM_BUCKETING_STRATEGY", "pad")
    monkeypatch.setenv("VLLM_PROMPT_SEQ_BUCKET_PAD_PERCENT", "50")
    ctx = HPUBucketingContext(16, None, 128, 4096, 4096, num_kv_blocks=512,
                              use_prompt_context=False)
    seq = ctx.prompt_seq_range.values()
    assert all(b - a <= max(128, a // 2) for a, b in zip(seq, seq[1:]))
    blocks = ctx.decode_block_range.values()
    assert all(b - a <= max(1, a // 4) for a, b in zip(blocks, blocks[1:]))
    monkeypatch.setenv("VLLM_PROMPT_SEQ_BUCKET_PAD_PERCENT", "0")
    with pytest.raises(ValueError, match="VLLM_PROMPT_SEQ_BUCKET_PAD_PERCENT"):
        HPUBucketingContext(16, None, 128, 4096, 4096)


def test_cli_on_a_sharegpt_like_file(tmp_path):
    rng = random.Random(0)
    convs = [{"conversations": [{"from": "human", "value": "x" * rng.randint(20, 3000)},
                                {"from": "gpt", "value": "y" * rng.randint(20, 800)}]}
             for _ in range(80)]
    trace = tmp_path / "sharegpt.json"
    trace.write_text(json.dumps(convs))
    out = tmp_path / "plan.json"
    res = subprocess.run([sys.executable, "-m", "vllm.hpu.bucket_planner", "--trace",
                          str(trace), "--max-buckets", "8", "--output", str(out),
                          "--block-size", "128", "--max-num-seqs", "16",
                          "--max-num-batched-tokens", "2048", "--max-model-len", "2048"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "default exp buckets" in res.stdout and "plan: " in res.stdout
    plan = load_plan(str(out))
    assert len(plan.prompt_buckets) <= 8 and len(plan.decode_buckets) <= 8
    bad = subprocess.run([sys.executable, "-m", "vllm.hpu.bucket_planner", "--trace",
                          str(trace)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "engine limits" in bad.stderr


def test_recorded_trace_round_trip(tmp_path):
    from vllm.hpu.bucket_trace import TraceRecorder
    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(str(path), LIMITS)
    rec.record(TracePass("prompt", 2, 100, 0, 150))
    rec.record(TracePass("decode", 2, 1, 3))
    rec.close()
    limits, passes = read_trace(str(path))
    assert limits == LIMITS and passes[0].real_tokens == 150 and passes[1].num_blocks == 3


def test_a_server_warms_exactly_the_plan_buckets_with_prompt_context(caplog):
    """Issue 54 item 2: a served 16-bucket plan became 64 prompt buckets, the server
    adding context variants of each. A plan made for prompts with context is taken
    as it is; only a plan without context buckets served where prompts have context
    gets them added, with a warning that gives the count."""
    prompt = [Bucket(1, 128, 0), Bucket(1, 128, 4), Bucket(4, 256, 0), Bucket(1, 512, 15)]
    decode = [Bucket(1, 1, 4), Bucket(8, 1, 64)]
    planned = BucketPlan(128, prompt, decode, use_prompt_context=True)
    ctx = HPUBucketingContext(8, None, 128, 2048, 2048, num_kv_blocks=128,
                              use_prompt_context=True, strategy="plan", plan=planned)
    assert sorted(ctx.prompt_buckets) == sorted(prompt)
    assert sorted(ctx.decode_buckets) == sorted(decode)
    legacy = BucketPlan(128, [b for b in prompt if not b.num_blocks], decode)
    with caplog.at_level("WARNING", logger="vllm"):
        ctx = HPUBucketingContext(8, None, 128, 2048, 2048, num_kv_blocks=128,
                                  use_prompt_context=True, strategy="plan", plan=legacy)
    assert ctx.num_prompt_buckets > 2
    assert f"its 2 prompt buckets become {ctx.num_prompt_buckets}" in caplog.text
    # Through a plan file: the flag survives the round trip.
    assert BucketPlan(**{**planned.__dict__}).to_json()["use_prompt_context"] is True


def test_plan_prompt_phase_with_context_classes():
    """Context classes share the bucket budget; each bucket's context is its class's
    highest; more buckets never cost more; no context is plan_phase itself."""
    from vllm.hpu.bucket_planner import plan_prompt_phase
    points = {(1, 100, 0): 5, (2, 50, 0): 3, (1, 30, 4): 4, (3, 20, 4): 2, (1, 10, 8): 1}
    costs = []
    for k in range(3, 9):
        buckets, cost, bound = plan_prompt_phase(points, k, 16)
        assert len(buckets) <= k and bound == 1.0
        for (b, q, c), n in points.items():  # every point covered
            assert any(x.batch_size >= b and x.query_len >= q and x.num_blocks >= c
                       for x in buckets)
        replay = sum(n * min(x.batch_size * (x.query_len + x.num_blocks * 16)
                             for x in buckets if x.batch_size >= b and x.query_len >= q
                             and x.num_blocks >= c) for (b, q, c), n in points.items())
        assert replay <= cost
        costs.append(cost)
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] == sum(n * b * (q + c * 16) for (b, q, c), n in points.items())
    plain = {(b, q, 0): n for (b, q, _), n in points.items()}
    buckets, cost, _ = plan_prompt_phase(plain, 3, 16)
    ref = plan_phase({(b, q): n for (b, q, _), n in plain.items()}, 3, prompt_group_cost)
    assert cost == ref.cost and buckets == [Bucket(b, q, 0) for b, q in ref.buckets]
