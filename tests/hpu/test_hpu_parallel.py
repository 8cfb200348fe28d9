"""Tensor, pipeline and data parallel on the fake HPU (gloo between the ranks)."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release
from vllm import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, " * 12,
           "Water boils at", "List three colors:"]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TINY = dict(max_num_seqs=4, kv_cache_memory_bytes=4 << 20)


def _generate(llm, prompts=PROMPTS):
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        llm = make_llm(model=path, **TINY)
        expected = _generate(llm)
        release(llm)
    return path, expected


@pytest.mark.timeout(240)
def test_pipeline_parallel_with_hpu_graphs_matches_cpu(tiny):
    """Two spawned PP stages warm up and capture independently, then serve bucketed
    passes (decode and prompt passes in one step) with the CPU platform's tokens."""
    path, expected = tiny
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", **SMALL_BUCKETS):
        llm = make_llm(model=path, pipeline_parallel_size=2,
                       distributed_executor_backend="mp", **TINY)
        assert _generate(llm) == expected
        stats = llm.llm_engine.engine_core.executor.collective_rpc("get_compile_stats")
        assert [s["num_compiles_after_warmup"] for s in stats] == [0, 0]
        assert all(s["num_graphed_buckets"] > 0 for s in stats)
        release(llm)


def test_device_index_places_replicas_after_each_other():
    """Replica r's local rank l uses device r * world_size + l (TP=2 x PP=2, DP=3)."""
    from vllm.config import ParallelConfig
    from vllm.worker.worker_base import WorkerBase

    class _Config:
        def __init__(self, dp_rank: int) -> None:
            self.parallel_config = ParallelConfig(
                tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=3,
                data_parallel_rank=dp_rank)

    got = [[WorkerBase(_Config(r), local_rank=lr, rank=lr).device_index for lr in range(4)]
           for r in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="data_parallel_rank must be in"):
        ParallelConfig(data_parallel_size=2, data_parallel_rank=2)


@pytest.mark.timeout(240)
def test_data_parallel_replicas_take_distinct_devices(tiny):
    """Two replicas of the server's data-parallel engine: each worker acquires its own
    fake HPU device (without a data_parallel_rank both would take device 0), and each
    replica serves the CPU platform's tokens."""
    import asyncio

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_engine import DPAsyncLLMEngine
    path, expected = tiny
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_SKIP_WARMUP="1", **SMALL_BUCKETS):
        args = AsyncEngineArgs(model=path, data_parallel_size=2, dtype="float32",
                               max_model_len=512, disable_log_stats=True, **TINY)
        engine = DPAsyncLLMEngine.from_engine_args(args)
        try:
            devices = [r.engine.engine_core.executor.collective_rpc("get_device_index")
                       for r in engine.replicas]
            assert devices == [[0], [1]]

            async def one(i: int) -> list[int]:
                final = None
                async for out in engine.generate(PROMPTS[i], GREEDY, request_id=f"r{i}"):
                    final = out
                return list(final.outputs[0].token_ids)

            async def both() -> list[list[int]]:
                return await asyncio.gather(one(0), one(1))

            assert asyncio.run(both()) == expected[:2]
        finally:
            engine.shutdown()


def test_mark_step_before_every_collective_in_lazy_mode(monkeypatch):
    """Lazy mode (the bridge's is_lazy()) cuts the graph before each all-reduce,
    all-gather, pipeline send and receive; eager/compile mode adds no hook."""
    import torch

    from vllm.hpu import habana
    from vllm.distributed import parallel_state as ps
    from vllm.hpu.worker import before_collective
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert before_collective() is None
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    hook = before_collective()
    assert hook is habana.mark_step

    seen: list[tuple[str, int]] = []

    def record(name):
        def op(*args, **kwargs):
            seen.append((name, habana.mark_step_count()))
        return op

    def recv_object_list(box, src, group):
        seen.append(("recv_object_list", habana.mark_step_count()))
        box[0] = [("h", torch.float32, (2, 3))]

    for name in ("all_reduce", "all_gather", "send", "send_object_list", "recv"):
        monkeypatch.setattr(ps.dist, name, record(name))
    monkeypatch.setattr(ps.dist, "recv_object_list", recv_object_list)
    group = ps.GroupCoordinator(ranks=[0, 1], rank=0, device_group="dev", cpu_group="cpu",
                                before_collective=hook)
    start = habana.mark_step_count()
    x = torch.ones(2, 3)
    group.all_reduce(x)
    group.all_gather(x)
    group.send_tensor_dict({"h": x})
    group.recv_tensor_dict()
    assert seen == [("all_reduce", start + 1), ("all_gather", start + 2),
                    ("send_object_list", start + 3), ("send", start + 3),
                    ("recv_object_list", start + 4), ("recv", start + 4)]

    # The worker's hook reaches both groups.
    ps.initialize_model_parallel(1, 1, before_collective=hook)
    try:
        assert ps.get_tp_group().before_collective is hook
        assert ps.get_pp_group().before_collective is hook
    finally:
        ps.destroy_model_parallel()


@pytest.mark.parametrize("bridge_lazy", [True, False])
def test_lazy_collectives_follow_the_bridge_is_lazy(tiny, monkeypatch, bridge_lazy):
    """PT_HPU_ENABLE_LAZY_COLLECTIVES is set for TP with HPU graphs when the bridge's
    is_lazy() says lazy, whatever PT_HPU_LAZY_MODE reads (one source of truth)."""
    import os

    from vllm.hpu import habana
    from vllm.engine.arg_utils import EngineArgs
    path, _ = tiny
    env_lazy = "0" if bridge_lazy else "1"  # disagree with the bridge on purpose
    with platform_env("hpu", PT_HPU_LAZY_MODE=env_lazy):
        monkeypatch.setattr(habana, "is_lazy", lambda: bridge_lazy)
        EngineArgs(model=path, tensor_parallel_size=2, dtype="float32",
                   max_model_len=512).create_engine_config()
        assert os.environ["PT_HPU_ENABLE_LAZY_COLLECTIVES"] == (
            "true" if bridge_lazy else "false")


def test_ray_workers_get_the_gaudi_runtime_variables(monkeypatch):
    """PT_HPU_* and HABANA_* travel to Ray workers with VLLM_*; the device assignment
    (HABANA_VISIBLE_MODULES / _DEVICES) stays with each node and Ray."""
    import os

    from vllm.executor.ray_utils import vllm_env_vars
    for name in list(os.environ):
        if name.startswith(("VLLM_", "PT_HPU_", "HABANA_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("VLLM_SKIP_WARMUP", "true")
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    monkeypatch.setenv("PT_HPU_ENABLE_LAZY_COLLECTIVES", "true")
    monkeypatch.setenv("HABANA_LOGS", "/tmp/habana_logs")
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1")
    monkeypatch.setenv("HABANA_VISIBLE_DEVICES", "all")
    monkeypatch.setenv("UNRELATED_SETTING", "1")
    assert vllm_env_vars() == {"VLLM_SKIP_WARMUP": "true", "PT_HPU_LAZY_MODE": "1",
                               "PT_HPU_ENABLE_LAZY_COLLECTIVES": "true",
                               "HABANA_LOGS": "/tmp/habana_logs"}


def test_graph_budget_is_the_minimum_over_tp_ranks(tiny, monkeypatch):
    """A rank with room for every graph captures only what its TP peer's smaller graph
    memory allows (the peer's budget fits one prompt graph of two), and every capture
    counts the larger of the two ranks' measurements."""
    from tests.hpu.conftest import runner_of
    from vllm.hpu import habana
    from vllm.hpu import warmup as hpu_warmup
    from vllm.hpu.bucketing import Bucket
    path, expected = tiny

    class PeerGroup:
        """This rank plus a peer with 80 KiB of graph memory measuring 1 byte more."""
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def all_reduce_int(self, value: int, op: str) -> int:
            self.calls.append((op, value))
            return min(value, 80 << 10) if op == "min" else max(value, value + 1)

    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1", VLLM_SKIP_WARMUP="1",
               VLLM_GRAPH_PROMPT_RATIO="0.5")
    with platform_env("hpu", **env):
        llm = make_llm(model=path, enable_prefix_caching=False, **TINY)
        runner = runner_of(llm)
        runner.mem_margin = habana.mem_get_info()[0] - (4 << 20)  # 4 MiB here: all would fit
        peers = PeerGroup()
        monkeypatch.setattr(hpu_warmup, "get_tp_group", lambda: peers)
        runner.warmup_model()
        prompt_graphs = {b for p, b in runner.graphed_buckets if p}
        decode_graphs = {b for p, b in runner.graphed_buckets if not p}
        assert prompt_graphs == {Bucket(1, 128, 0)}
        assert decode_graphs == set(runner.bucketing.decode_buckets)
        assert peers.calls[0] == ("min", 4 << 20)
        assert [op for op, _ in peers.calls[1:]] == ["max"] * len(runner.graphed_buckets)
        assert _generate(llm) == expected
        release(llm)


@pytest.mark.timeout(240)
def test_tp_ranks_with_different_memory_capture_the_same_buckets(tiny):
    """Device 1 has no memory left after the weights (VLLM_FAKE_HPU_MEMORY_GB lists one
    size per device): rank 0, with 16 GiB, captures no graph either, so no rank ever
    replays a graph (and its collectives) while its peer runs eagerly."""
    path, expected = tiny
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_FAKE_HPU_MEMORY_GB="16,0.001",
                      **SMALL_BUCKETS):
        llm = make_llm(model=path, tensor_parallel_size=2, distributed_executor_backend="mp",
                       **TINY)
        executor = llm.llm_engine.engine_core.executor
        assert executor.collective_rpc("get_device_index") == [0, 1]
        assert _generate(llm) == expected
        stats = executor.collective_rpc("get_compile_stats")
        assert [s["num_graphed_buckets"] for s in stats] == [0, 0]
        assert [s["num_compiles_after_warmup"] for s in stats] == [0, 0]
        release(llm)


def test_fake_hpu_ranks_share_the_host_cores():
    """Fake HPU ranks (TP=2 x DP=2) take a quarter of the cores each instead of the
    engine's thread count (forked ranks that inherited 2 threads after the engine ran
    OpenMP work hung in their first parallel region)."""
    import os

    import torch

    from vllm.config import ParallelConfig
    from vllm.hpu.worker import HPUWorker

    class _Config:
        parallel_config = ParallelConfig(tensor_parallel_size=2, data_parallel_size=2)

    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    try:
        torch.set_num_threads(cores + 3)
        HPUWorker(_Config(), local_rank=1, rank=1)._share_host_cores()
        assert torch.get_num_threads() == max(1, cores // 4)
    finally:
        torch.set_num_threads(threads)
