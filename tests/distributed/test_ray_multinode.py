"""The Ray executor over a 2-node Ray cluster on one machine (ray.cluster_utils.Cluster):
TP=2 with one rank per node equals the one-process tokens, on CPU and on the fake HPU
(each node declares one HPU, as the two-host example of docs/gaudi/multi-node.md does); more ranks than
the nodes' HPUs fail with the per-node count and how to declare them; a server on the
cluster whose worker on one node is killed fails the request and reports unhealthy.

One cluster for the module (Ray starts slowly on few cores): each node has one CPU and
one HPU, so the placement group must put the two ranks on different nodes; each node
also has a custom resource naming it.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from _dist_helpers import ENGINE_KWARGS, PROMPTS, MAX_TOKENS, greedy_token_ids, wait_gone

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # pragma: no cover - depends on the environment
    ray = None

pytestmark = pytest.mark.skipif(ray is None, reason="ray is not installed (pip install ray)")


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """The module's cluster outlives its tests (checked at its teardown instead)."""
    yield


@pytest.fixture(scope="module")
def two_node_cluster():
    if ray.is_initialized():
        ray.shutdown()
    before = set(p.pid for p in psutil.Process().children(recursive=True))
    # The raylets read this at start: on a shared machine, another process's memory
    # must not make Ray's OOM monitor kill the ranks of this test.
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_memory_monitor_refresh_ms", "0")
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, resources={"node_a": 1, "HPU": 1}, include_dashboard=False,
        object_store_memory=96 << 20))
    cluster.add_node(num_cpus=1, resources={"node_b": 1, "HPU": 1},
                     object_store_memory=96 << 20)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()
        mp.undo()
        left = wait_gone(set(p.pid for p in psutil.Process().children(recursive=True))
                         - before, timeout_s=30)
        assert not left, f"Ray processes left behind: {left}"


@pytest.mark.timeout(300)
def test_tp2_across_two_nodes_matches_one_process(two_node_cluster, tiny_qwen2,
                                                  tiny_reference, monkeypatch):
    from vllm import LLM
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    forwarded = {"VLLM_TEST_FORWARDED": "1", "PT_HPU_TEST_FORWARDED": "2",
                 "HABANA_TEST_FORWARDED": "3"}
    for name, value in forwarded.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "7")  # each node's own business
    llm = LLM(tiny_qwen2, tensor_parallel_size=2, distributed_executor_backend="ray",
              **ENGINE_KWARGS)
    try:
        assert greedy_token_ids(llm) == tiny_reference

        def where(worker):
            import ray as worker_ray
            ctx = worker_ray.get_runtime_context()
            env = {n: os.environ.get(n) for n in ("VLLM_TEST_FORWARDED",
                                                   "PT_HPU_TEST_FORWARDED",
                                                   "HABANA_TEST_FORWARDED",
                                                   "HABANA_VISIBLE_MODULES")}
            return worker.rank, ctx.get_node_id(), env

        placed = llm.collective_rpc(where)
        assert [rank for rank, _, _ in placed] == [0, 1]
        assert len({node for _, node, _ in placed}) == 2  # one rank on each node
        # The engine's VLLM_* / PT_HPU_* / HABANA_* reached both nodes; device
        # visibility did not.
        assert all(env == {**forwarded, "HABANA_VISIBLE_MODULES": None}
                   for _, _, env in placed)

        # A rank's death while idle is noticed without any call (its pending watch).
        os.kill(llm.collective_rpc(lambda w: os.getpid())[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="rank 1 died unexpectedly during idle time"):
            while time.monotonic() < deadline:
                llm.llm_engine.check_health()
                time.sleep(0.2)
    finally:
        llm.llm_engine.shutdown()
        del llm
    assert not ray.is_initialized()  # the engine's connection closed; the cluster stays


@pytest.mark.timeout(300)
def test_fake_hpu_tp2_across_two_nodes_that_declare_their_hpu(two_node_cluster, tiny_qwen2,
                                                              tiny_reference, monkeypatch):
    """The two-host example of docs/gaudi/multi-node.md on one machine: nodes started with
    resources={"HPU": 1} hold one fake-HPU rank each (the engine's VLLM_* settings reach
    the other node's rank), with the one-process tokens."""
    from tests.hpu.conftest import SMALL_BUCKETS, platform_env
    from vllm import LLM
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    with platform_env("hpu", VLLM_SKIP_WARMUP="1", **SMALL_BUCKETS):
        llm = LLM(tiny_qwen2, tensor_parallel_size=2, distributed_executor_backend="ray",
                  **ENGINE_KWARGS)
        try:
            assert greedy_token_ids(llm) == tiny_reference

            def where(worker):
                import ray as worker_ray
                return (worker_ray.get_runtime_context().get_node_id(),
                        type(worker).__name__)

            placed = llm.collective_rpc(where)
            assert len({node for node, _ in placed}) == 2
            assert {kind for _, kind in placed} == {"HPUWorker"}
        finally:
            llm.llm_engine.shutdown()
            del llm


@pytest.mark.timeout(120)
def test_more_ranks_than_declared_hpus_names_the_nodes_and_the_remedy(two_node_cluster,
                                                                     tiny_qwen2, monkeypatch,
                                                                     caplog):
    """4 ranks on nodes offering 2 HPU: said at once (a warning), then the placement
    timeout's error names each node's count and `ray start --resources`."""
    from tests.hpu.conftest import platform_env
    from vllm import LLM
    from vllm.executor import ray_utils
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    monkeypatch.setattr(ray_utils, "PLACEMENT_GROUP_TIMEOUT_S", 3.0)
    with platform_env("hpu", VLLM_SKIP_WARMUP="1"), caplog.at_level("WARNING"):
        with pytest.raises(ValueError) as err:
            LLM(tiny_qwen2, tensor_parallel_size=2, pipeline_parallel_size=2,
                distributed_executor_backend="ray", **ENGINE_KWARGS)
    message = str(err.value)
    assert "4 ranks need 4 HPU but the cluster's nodes offer 2 (" in message
    assert message.count(": 1") >= 2  # one HPU on each node
    assert """--resources='{"HPU": 8}'""" in message
    assert any("4 ranks need 4 HPU" in r.getMessage() for r in caplog.records)
    assert not ray.is_initialized()


def _actor_pids() -> list[int]:
    """This machine's Ray worker processes hosting ranks (the test's cluster's nodes)."""
    pids = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "RayWorkerWrapper" in " ".join(p.cmdline()):
                pids.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


@pytest.mark.timeout(300)
def test_server_on_two_nodes_killed_worker_fails_requests_and_health(two_node_cluster,
                                                                     tiny_qwen2,
                                                                     tiny_reference):
    from tests.entrypoints.conftest import RemoteServer
    srv = RemoteServer([
        "--model", tiny_qwen2, "--dtype", "float32", "--max-model-len", "1024",
        "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(32 << 20),
        "--no-enable-prefix-caching", "-tp", "2", "--distributed-executor-backend", "ray",
        "--disable-log-requests"], env={"RAY_ADDRESS": two_node_cluster.address,
                                        # stay up answering 503 instead of exiting 1 (a
                                        # race with the /health poll otherwise)
                                        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            model = http.get("/v1/models").json()["data"][0]["id"]
            r = http.post("/v1/completions", json={
                "model": model, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                "temperature": 0.0, "ignore_eos": True, "return_tokens_as_token_ids": True,
                "logprobs": 0})
            assert r.status_code == 200, r.text
            tokens = [int(t.removeprefix("token_id:"))
                      for t in r.json()["choices"][0]["logprobs"]["tokens"]]
            assert tokens == tiny_reference[0]
            pids = _actor_pids()
            assert len(pids) == 2, pids

            result: list = []

            def long_request() -> None:
                result.append(http.post("/v1/completions", json={
                    "model": model, "prompt": PROMPTS[1], "max_tokens": 900,
                    "temperature": 0.0, "ignore_eos": True}))

            runner = threading.Thread(target=long_request)
            runner.start()
            time.sleep(1.0)  # generating
            os.kill(pids[-1], signal.SIGKILL)
            runner.join(90)
            assert not runner.is_alive(), "the request hung after a worker died"
            assert result[0].status_code == 503, result[0].text
            assert "died unexpectedly" in result[0].json()["error"]["message"]
            deadline = time.monotonic() + 30
            while http.get("/health").status_code != 503:
                assert time.monotonic() < deadline, "/health never reported the failure"
                time.sleep(0.2)
            r = http.post("/v1/completions", json={"model": model, "prompt": "x",
                                                   "max_tokens": 2})
            assert r.status_code == 503, r.text
    finally:
        srv.stop(signal.SIGTERM)
