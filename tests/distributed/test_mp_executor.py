"""Tensor and pipeline parallel over worker processes: same greedy tokens as one process."""
from __future__ import annotations

import os
import signal

import pytest

from _dist_helpers import (ENGINE_KWARGS, child_pids, greedy_token_ids, run_greedy,
                      run_greedy_in_process)


@pytest.mark.timeout(240)
def test_default_model_tp3_and_pp2_match_one_process(default_model_path):
    """SmolLM2 (9 query / 3 KV heads, 30 layers): TP=3 and PP=2 change no greedy token."""
    reference = run_greedy_in_process(default_model_path)
    assert run_greedy(default_model_path, tensor_parallel_size=3) == reference
    assert run_greedy(default_model_path, pipeline_parallel_size=2) == reference


@pytest.mark.timeout(120)
def test_tp2_gqa_model_matches_one_process_also_after_ctrl_c(tiny_qwen2, tiny_reference):
    """Two KV heads split one per rank (Qwen2 layout, with QKV biases). A Ctrl-C in the
    middle of generate() leaves the engine usable: the late reply of the interrupted
    step is dropped, and the aborted requests are released on every rank."""
    from vllm import LLM, SamplingParams
    llm = LLM(tiny_qwen2, tensor_parallel_size=2, **ENGINE_KWARGS)
    assert greedy_token_ids(llm) == tiny_reference

    executor = llm.llm_engine.engine_core.executor
    real_execute = executor.execute_model
    steps = {"n": 0}

    def execute_then_interrupt(scheduler_output):
        steps["n"] += 1
        if steps["n"] == 5:
            # As if Ctrl-C arrived while the engine waited for the workers' reply.
            executor.collective_rpc = _interrupt_after_send(executor.collective_rpc)
        return real_execute(scheduler_output)

    executor.execute_model = execute_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Hello"] * 4, SamplingParams(max_tokens=100, ignore_eos=True),
                     use_tqdm=False)
    del executor.execute_model, executor.collective_rpc
    assert not llm.llm_engine.has_unfinished_requests()
    assert greedy_token_ids(llm) == tiny_reference
    llm.llm_engine.shutdown()


def _interrupt_after_send(collective_rpc):
    """collective_rpc that sends the call, then raises KeyboardInterrupt instead of waiting."""
    executor = collective_rpc.__self__

    def rpc(method, args=(), unique_reply_rank=None, timeout=None):
        from vllm.executor.multiproc_utils import RpcRequest
        executor.group.broadcast(RpcRequest(method, tuple(args), unique_reply_rank))
        raise KeyboardInterrupt

    return rpc


@pytest.mark.timeout(180)
def test_tp2_pp2_matches_then_killed_worker_raises(tiny_qwen2, tiny_reference):
    """Four ranks agree with one process; then SIGKILL of a non-driver rank mid-generation
    makes generate() raise within seconds, and the other workers are stopped."""
    from vllm import LLM, SamplingParams
    llm = LLM(tiny_qwen2, tensor_parallel_size=2, pipeline_parallel_size=2, **ENGINE_KWARGS)
    executor = llm.llm_engine.engine_core.executor
    assert type(executor).__name__ == "MultiprocExecutor"
    assert greedy_token_ids(llm) == tiny_reference
    pids = executor.worker_pids
    assert len(pids) == 4 and set(pids) <= child_pids()

    real_execute = executor.execute_model
    steps = {"n": 0, "killed_at": None}

    def execute_and_kill(scheduler_output):
        steps["n"] += 1
        if steps["n"] == 3:  # a few tokens into the generation
            os.kill(pids[1], signal.SIGKILL)  # TP rank 1 of the first stage
            steps["killed_at"] = steps["n"]
        return real_execute(scheduler_output)

    executor.execute_model = execute_and_kill
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    # The death is noticed by its signal (this message), not waited out by an RPC
    # timeout, by the step that was running or the next one (with pipeline stages the
    # kill may land between a stage's send and the next step): no clock needed.
    with pytest.raises(RuntimeError, match=r"rank 1 .*died unexpectedly .*SIGKILL"):
        llm.generate(["Hello"] * 4, params, use_tqdm=False)
    assert steps["n"] - steps["killed_at"] <= 1, steps
    with pytest.raises(RuntimeError, match="died unexpectedly"):
        llm.llm_engine.check_health()
    llm.llm_engine.shutdown()


def test_sizes_that_do_not_split_the_model_fail_early(default_model_path, tiny_qwen2):
    """ValueError naming the flag and the valid sizes, before any worker starts."""
    from vllm import LLM
    before = child_pids()
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 .*num_attention_heads=9.*"
                                         r"valid sizes: 1, 3\."):
        LLM(default_model_path, tensor_parallel_size=2, **ENGINE_KWARGS)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=3 .*num_hidden_layers \(2\)"
                                         r".*1\.\.2"):
        LLM(tiny_qwen2, pipeline_parallel_size=3, **ENGINE_KWARGS)
    with pytest.raises(ValueError, match="data_parallel_size=2"):
        LLM(tiny_qwen2, data_parallel_size=2, **ENGINE_KWARGS)
    assert child_pids() == before


def test_valid_tensor_parallel_sizes():
    from types import SimpleNamespace

    from vllm.executor.distributed_executor import valid_tensor_parallel_sizes
    smollm2 = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3,
                              intermediate_size=1536)
    assert valid_tensor_parallel_sizes(smollm2) == [1, 3]
    # One KV head replicated on every rank (MQA) is allowed.
    mqa = SimpleNamespace(num_attention_heads=8, num_key_value_heads=1, intermediate_size=64)
    assert valid_tensor_parallel_sizes(mqa) == [1, 2, 4, 8]
    # 4 KV heads: TP=8 replicates each on 2 ranks; TP=6 would split them unevenly.
    gqa = SimpleNamespace(num_attention_heads=24, num_key_value_heads=4, intermediate_size=96)
    assert valid_tensor_parallel_sizes(gqa) == [1, 2, 4, 8, 12, 24]
