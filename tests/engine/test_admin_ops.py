"""Admin operations through the one utility path: collective_rpc, sleep mode, profiling."""
from __future__ import annotations

import gc
import glob

import psutil
import pytest

from vllm import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there"]
KV_BYTES = 96 << 20
ENGINE_KWARGS = dict(dtype="float32", max_model_len=256, max_num_seqs=8,
                     kv_cache_memory_bytes=KV_BYTES)


def greedy(llm, prompts=PROMPTS) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params,
                                                               use_tqdm=False)]


def runner_of(llm):
    return llm.llm_engine.engine_core.executor.worker.model_runner


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from vllm import LLM
    engine = LLM(tiny_llama, enable_sleep_mode=True, **ENGINE_KWARGS)
    yield engine
    engine.llm_engine.shutdown()
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def reference(llm) -> list[list[int]]:
    return greedy(llm)


def test_collective_rpc_one_result_per_rank(llm):
    assert llm.collective_rpc("get_device_index") == [0]
    assert llm.llm_engine.collective_rpc("get_device_index") == [0]


def test_collective_rpc_runs_a_callable_on_the_worker(llm):
    def describe(worker, offset, scale=1):
        return (type(worker).__name__, worker.rank, offset * scale)

    assert llm.collective_rpc(describe, args=(3,), kwargs={"scale": 2}) == [
        ("CPUWorker", 0, 6)]
    assert llm.collective_rpc(lambda worker: worker.model_runner.num_kv_blocks) == [
        llm.llm_engine.vllm_config.cache_config.num_gpu_blocks]


def test_unknown_utility_is_a_value_error(llm):
    with pytest.raises(ValueError, match="Unknown engine utility 'no_such_op'"):
        llm.llm_engine.call_utility("no_such_op")


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_the_kv_cache_and_wake_up_gives_identical_greedy_output(
        llm, reference, level):
    runner = runner_of(llm)
    params = dict(runner.model.named_parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    # The cache is committed in the background after start-up: all of it is resident
    # before measuring what sleep gives back.
    from vllm.worker.kv_cache_alloc import wait_committed
    assert wait_committed(timeout=60)
    before = rss()
    llm.sleep(level=level)
    assert llm.llm_engine.is_sleeping()
    assert runner.kv_caches == []
    freed = before - rss()
    # Level 2 gives the weights' memory back to the OS too.
    expected = 0.8 * (KV_BYTES + (weight_bytes if level == 2 else 0))
    assert freed > expected, f"only {freed / 2**20:.1f} MiB freed"
    if level == 2:
        assert all(p.numel() == 0 for p in params.values())  # weights discarded
    else:
        assert all(p.numel() > 0 for p in params.values())  # kept in host memory
    with pytest.raises(ValueError, match="sleeping; call wake_up"):
        greedy(llm)
    llm.wake_up()
    assert not llm.llm_engine.is_sleeping()
    assert len(runner.kv_caches) > 0
    assert greedy(llm) == reference


@pytest.mark.parametrize("level", [1, 2])
def test_bf16_sleep_keeps_the_native_decode_path_correct(tiny_llama, level):
    """bf16 decodes run through prepared native layer calls holding weight pointers and
    packed copies: after a wake-up they must be rebuilt from the restored weights."""
    from vllm import LLM
    engine = LLM(tiny_llama, enable_sleep_mode=True,
                 **{**ENGINE_KWARGS, "dtype": "bfloat16", "kv_cache_memory_bytes": 16 << 20})
    try:
        expected = greedy(engine)
        stacks = [m for m in runner_of(engine).model.modules() if hasattr(m, "state")
                  and type(m).__name__ == "DecoderStack"]
        native = any(s.state.get("runner") is not None for s in stacks)
        engine.sleep(level=level)
        assert all(not s.state for s in stacks)
        engine.wake_up()
        assert greedy(engine) == expected
        if native:  # the native decode layers ran again, on rebuilt calls
            assert all(s.state.get("runner") is not None for s in stacks)
    finally:
        engine.llm_engine.shutdown()


def test_wake_up_by_tags(llm, reference):
    runner = runner_of(llm)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    assert llm.llm_engine.is_sleeping()  # the KV cache is still released
    assert runner.kv_caches == []
    assert all(p.numel() > 0 for p in runner.model.parameters())
    with pytest.raises(ValueError, match="tags"):
        llm.wake_up(tags=["activations"])
    llm.wake_up(tags=["kv_cache"])
    assert not llm.llm_engine.is_sleeping()
    assert greedy(llm) == reference


def test_sleep_level_and_running_requests_are_checked(llm):
    with pytest.raises(ValueError, match="level=3"):
        llm.sleep(level=3)
    engine = llm.llm_engine
    engine.add_request("busy", "Hello", SamplingParams(max_tokens=4))
    try:
        with pytest.raises(ValueError, match="requests are running"):
            llm.sleep()
    finally:
        engine.abort_request("busy")
    assert not engine.is_sleeping()


def test_sleep_needs_enable_sleep_mode(tiny_llama):
    from vllm import LLM
    plain = LLM(tiny_llama, **{**ENGINE_KWARGS, "kv_cache_memory_bytes": 8 << 20})
    try:
        with pytest.raises(ValueError, match="enable_sleep_mode"):
            plain.sleep()
        assert not plain.llm_engine.is_sleeping()
    finally:
        plain.llm_engine.shutdown()


def test_profile_writes_a_trace_per_worker(llm, tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="VLLM_TORCH_PROFILER_DIR"):
        llm.start_profile()
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("VLLM_TORCH_PROFILER_WITH_STACK", "0")
    with pytest.raises(ValueError, match="not running"):
        llm.stop_profile()
    llm.start_profile()
    greedy(llm, PROMPTS[:1])
    llm.stop_profile()
    traces = glob.glob(str(tmp_path / "rank0.*.pt.trace.json.gz"))
    assert len(traces) == 1
