"""HPU graph memory measured, not guessed: the reserve and the KV cache are sized from
probe graphs, and a graph that does not fit is skipped with a log line, never an OOM.

The fake device refuses a capture beyond its free memory (torch.OutOfMemoryError),
as Gaudi's allocator does, so the recovery paths run off hardware.
"""
from __future__ import annotations

import gc
import logging

import pytest
import torch

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from vllm import SamplingParams
from vllm.hpu import habana
from vllm.hpu.bucketing import Bucket
from vllm.hpu.execution import ExecutionMode
from vllm.hpu.graph_memory import (GraphMemoryModel, is_device_oom, plan_graph_reserve,
                                   probe_buckets)
from vllm.hpu.warmup import HPUWarmup, WarmupOps

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
SMALL = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "2",
         "VLLM_PROMPT_SEQ_BUCKET_MAX": "128", "VLLM_DECODE_BS_BUCKET_MAX": "4"}
ENGINE = dict(enable_prefix_caching=False, max_num_seqs=4, gpu_memory_utilization=1.0)


def _truth(is_prompt: bool, b: Bucket) -> int:
    """A made-up device: 5000 B per graph, 48 B per token / row, 7 B per KV block."""
    return 5000 + 48 * b.batch_size * (b.query_len if is_prompt else 1) + 7 * (
        b.batch_size * b.num_blocks if is_prompt else b.num_blocks)


@pytest.mark.parametrize("is_prompt", [True, False])
def test_probes_pin_down_a_linear_cost(is_prompt):
    if is_prompt:
        buckets = [Bucket(b, q, c) for b in (1, 2, 4) for q in (128, 256) for c in (0, 2, 8)]
    else:
        buckets = [Bucket(b, 1, n) for b in (1, 2, 4, 8) for n in (8, 16, 64, 512) if b <= n]
    probes = probe_buckets(is_prompt, buckets, max_blocks=16)
    assert 2 <= len(probes) <= 3
    assert all(p.num_blocks <= 16 for p in probes)  # fit the temporary cache
    model = GraphMemoryModel.fit(is_prompt, [(p, _truth(is_prompt, p)) for p in probes])
    for b in buckets:  # extrapolates past the probes (512 blocks, 4 x 256 tokens)
        assert model.estimate(b) == pytest.approx(_truth(is_prompt, b), rel=1e-9)


def test_reserve_is_the_sum_with_headroom_and_capped():
    prompt = GraphMemoryModel(True, (1000.0, 10.0, 0.0))
    decode = GraphMemoryModel(False, (500.0, 0.0, 1.0))
    pb, db = [Bucket(1, 100, 0)], [Bucket(1, 1, 100), Bucket(2, 1, 400)]
    plan = plan_graph_reserve(prompt, decode, pb, db, usable=10**9)
    assert (plan.prompt_bytes, plan.decode_bytes) == (2000.0, 1500.0)
    assert plan.reserve == int(3500 * 1.1) and not plan.capped
    small = plan_graph_reserve(prompt, decode, pb, db, usable=2000)
    assert small.reserve == 1000 and small.capped


def test_oom_errors_are_recognised():
    assert is_device_oom(torch.OutOfMemoryError("x"))
    assert is_device_oom(RuntimeError("[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"))
    assert not is_device_oom(RuntimeError("shape mismatch"))
    assert not is_device_oom(ValueError("out of memory"))


class _Device:
    """Captures take `_truth` bytes of the fake device; the device refuses what does
    not fit (the fake HPU's graph recorder raises the same error)."""

    def __init__(self, graph_budget: int) -> None:
        self.mem_margin = habana.mem_get_info()[0] - graph_budget
        self.held: list[int] = []
        self.forgotten: list[Bucket] = []

    def capture_graph(self, is_prompt: bool, bucket: Bucket) -> None:
        need = _truth(is_prompt, bucket)
        if need > habana.mem_get_info()[0] - self.mem_margin:
            raise torch.OutOfMemoryError(f"capture of {need} bytes")
        self.held.append(habana.track_alloc(need))

    def release(self) -> None:
        for nbytes in self.held:
            habana.track_free(nbytes)


def _capture(device: _Device, prompt, decode, models=None):
    ops = WarmupOps(prompt, decode, block_size=128, mode=ExecutionMode.HPU_GRAPHS,
                    uses_hpu_graphs=True, mem_margin=device.mem_margin,
                    run_dummy_batch=lambda is_prompt, bucket: None,
                    capture_graph=device.capture_graph,
                    forget_graph=lambda is_prompt, bucket: device.forgotten.append(bucket),
                    warmup_defragmenter=lambda: None, graph_models=models)
    return HPUWarmup(ops)._capture_graphs(prompt, decode)


def test_a_capture_the_device_refuses_is_skipped_not_fatal(caplog, monkeypatch):
    """No model (VLLM_GRAPH_RESERVED_MEM set by hand): the first prompt capture is a
    blind try that the device refuses; it is logged and skipped, the rest go on."""
    monkeypatch.setenv("VLLM_GRAPH_PROMPT_RATIO", "0.5")
    monkeypatch.setenv("VLLM_GRAPH_PROMPT_STRATEGY", "max_bs")  # (4, 128) first
    prompt = [Bucket(1, 128, 0), Bucket(4, 128, 0)]
    decode = [Bucket(1, 1, 4), Bucket(2, 1, 4)]
    device = _Device(graph_budget=2 * 12000)  # a (4, 128) graph takes ~29.6 kB
    try:
        with caplog.at_level(logging.INFO, logger="vllm"):
            p, d = _capture(device, prompt, decode)
    finally:
        device.release()
    assert p.out_of_memory == [Bucket(4, 128, 0)] and device.forgotten == [Bucket(4, 128, 0)]
    assert p.captured == [Bucket(1, 128, 0)] and sorted(d.captured) == decode
    assert "capture ran out of device memory" in caplog.text


def test_measured_model_skips_what_would_not_fit_before_trying(monkeypatch):
    """With the measured model a bucket whose estimate exceeds what is left is skipped
    up front: the device never sees an allocation it must refuse."""
    monkeypatch.delenv("VLLM_GRAPH_PROMPT_RATIO", raising=False)
    monkeypatch.delenv("VLLM_GRAPH_PROMPT_STRATEGY", raising=False)
    prompt = [Bucket(1, 128, 0), Bucket(4, 128, 0)]
    decode = [Bucket(1, 1, 4), Bucket(2, 1, 4)]
    models = tuple(GraphMemoryModel.fit(is_prompt, [(b, _truth(is_prompt, b)) for b in bs])
                   for is_prompt, bs in ((True, prompt), (False, decode)))
    device = _Device(graph_budget=_truth(True, prompt[0]) + sum(_truth(False, b) for b in decode)
                     + 100)
    try:
        p, d = _capture(device, prompt, decode, models)
    finally:
        device.release()
    assert p.out_of_memory == [] and d.out_of_memory == []
    assert p.captured == [Bucket(1, 128, 0)] and p.skipped == [Bucket(4, 128, 0)]
    assert sorted(d.captured) == decode
    assert p.predicted_bytes + d.predicted_bytes == pytest.approx(p.used_bytes + d.used_bytes)


def _serve(llm, prompts):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def measured():
    """The default model on the fake HPU with a measured graph reserve (16 GiB), the
    numbers the tight-memory runs below are sized from, and the CPU's tokens."""
    with platform_env("cpu"):
        llm = make_llm(kv_cache_memory_bytes=64 << 20)
        prompts = ragged_prompt_ids(llm.get_tokenizer(), [5, 40, 100, 120])
        expected = _serve(llm, prompts)
        release(llm)
    with platform_env("hpu", **SMALL):
        llm = make_llm(**ENGINE)
        runner = runner_of(llm)
        worker = llm.llm_engine.engine_core.executor.worker
        info = dict(weights=habana.mem_get_info()[1] - worker.memory_budget.free,
                    block=runner.get_kv_cache_block_bytes(),
                    graphs=habana.graph_stats(runner.forward_module).captured_bytes(),
                    num_graphs=len(runner.graphed_buckets),
                    held=runner.get_bucket_stats()["graph_memory_bytes"])
        assert _serve(llm, prompts) == expected
        del runner, worker
        release(llm)
    return prompts, expected, info


def _tight_memory_gb(info) -> str:
    """Weights, 16 KV blocks + the pad block, and 200 KiB: less than the graphs need."""
    gc.collect()  # the fixture's engine is gone from the fake device's ledger
    assert habana.tracked_bytes() == 0
    total = info["weights"] + 17 * info["block"] + (200 << 10)
    return repr(total / (1 << 30))


def test_measured_reserve_predicts_the_graphs_and_captures_all(measured, caplog):
    prompts, expected, info = measured
    assert info["num_graphs"] == 14  # 2 prompt + 12 decode buckets
    with platform_env("hpu", VLLM_FAKE_HPU_MEMORY_GB=_tight_memory_gb(info), **SMALL), \
            caplog.at_level(logging.INFO, logger="vllm"):
        llm = make_llm(**ENGINE)
        runner = runner_of(llm)
        stats = habana.graph_stats(runner.forward_module)
        # The KV cache gave up a block so that every graph fits: all captured, none refused.
        assert runner.num_kv_blocks == 15
        assert len(runner.graphed_buckets) == 14 and runner.graph_refused == set()
        assert "HPU graph memory measured on 5 probe graphs" in caplog.text
        budget = llm.llm_engine.engine_core.executor.worker.memory_budget
        assert stats.captured_bytes() <= budget.graph_reserved
        assert budget.graph_reserved <= 1.1 * stats.captured_bytes() + 1024
        assert _serve(llm, prompts) == expected
        assert runner.num_compiles_after_warmup == 0
        release(llm)


def test_graph_memory_gauge_is_what_the_captures_took(measured):
    """vllm:hpu_graph_memory_bytes: the runner's measurement at each capture (the fake
    device's ledger before minus after) adds up to what the shim's graphs hold."""
    from prometheus_client import CollectorRegistry, generate_latest

    from vllm.engine.bucket_metrics import BucketMetrics
    held = measured[2]["held"]
    assert held["prompt"] > 0 and held["decode"] > 0
    assert held["prompt"] + held["decode"] == measured[2]["graphs"]
    registry = CollectorRegistry()
    BucketMetrics(registry, ["model_name"], ("m",)).update(
        {"padded_tokens": {}, "real_tokens": {}, "padding_waste": {},
         "graph_memory_bytes": held})
    text = generate_latest(registry).decode()
    assert (f'vllm:hpu_graph_memory_bytes{{model_name="m",phase="decode"}} '
            f'{float(held["decode"])}') in text


def test_hand_set_reserve_too_small_skips_graphs_never_ooms(measured, caplog):
    """vllm-gaudi's failure: a hand-set reserve smaller than the graphs. Here the
    captures the device refuses are logged and skipped; serving still gives the CPU's
    tokens (those buckets run without graphs) and compiles nothing new."""
    prompts, expected, info = measured
    with platform_env("hpu", VLLM_FAKE_HPU_MEMORY_GB=_tight_memory_gb(info),
                      VLLM_GRAPH_RESERVED_MEM="0.0001", **SMALL), \
            caplog.at_level(logging.INFO, logger="vllm"):
        llm = make_llm(**ENGINE)
        runner = runner_of(llm)
        assert runner.num_kv_blocks == 16
        refused = {b for p, b in runner.graph_refused if p}
        assert refused == {Bucket(1, 128, 0), Bucket(2, 128, 0)}
        assert "capture ran out of device memory" in caplog.text
        held = runner.get_bucket_stats()["graph_memory_bytes"]  # refused: nothing held
        assert held == {"prompt": 0, "decode": measured[2]["held"]["decode"]}
        assert all((False, b) in runner.graphed_buckets for b in runner.bucketing.decode_buckets)
        assert _serve(llm, prompts) == expected
        assert runner.num_compiles_after_warmup == 0
        release(llm)
