"""Mamba2ForCausalLM (state slots instead of KV blocks; vllm/worker/state_cache.py) on
CPU: greedy tokens and top-5 logprobs equal transformers' (fp32, prompts of several
lengths, 32 tokens); a prefill cut in 16-token chunks carries the conv and SSM states
across chunks (equal to unchunked); a preempted request (priority scheduling) recomputes
from a zeroed slot and gives the tokens it has alone; a budget that holds one request's
state caps max_num_seqs to 1 with the same tokens; every slot is free afterwards."""
from __future__ import annotations

import gc

import pytest
import torch

from tests.models.test_breadth_hf import assert_matches_transformers, greedy_with_logprobs
from vllm import LLM

MAMBA2 = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
              state_size=16, n_groups=2, expand=2, conv_kernel=4, chunk_size=8,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPTS = [[(7 * i + 3 * k) % 4000 + 100 for i in range(n)]
           for k, n in enumerate((1, 5, 17, 40))]
STATE_BYTES = 2 * (192 * 3 + 8 * 16 * 16) * 4
"""Per request: 2 layers x (conv state [conv_dim 192, K-1 3] + SSM state [8, 16, 16]) fp32."""


@pytest.fixture(scope="module")
def mamba2_path(tmp_path_factory):
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    directory = str(tmp_path_factory.mktemp("tiny-mamba2"))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Mamba2Config(**MAMBA2),
                                                          dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)  # decisive greedy choices
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def _run(path: str, **kwargs):
    kwargs = {"max_model_len": 256, "max_num_seqs": 4, **kwargs}
    llm = LLM(model=path, dtype="float32", block_size=16, **kwargs)
    results = greedy_with_logprobs(llm, PROMPTS)
    engine = llm.llm_engine
    runner = engine.engine_core.executor.worker.model_runner
    state = runner.state_cache
    stats = engine.get_stats()
    info = dict(preemptions=stats.num_preemptions, free_slots=len(state._free),
                slots=state.num_slots, held=dict(state.slot_of),
                config=engine.engine_core.kv_cache_config,
                caching=engine.engine_core.scheduler.kv_cache_manager.enable_caching)
    engine.shutdown()
    del llm
    gc.collect()
    return results, info


def test_mamba2_matches_transformers_chunked_and_preempted(mamba2_path):
    results, info = _run(mamba2_path)
    assert info["config"].state_bytes_per_request() == STATE_BYTES
    assert not info["config"].kv_cache_groups and not info["caching"]
    assert info["held"] == {} and info["free_slots"] == info["slots"] == 4
    assert_matches_transformers(mamba2_path, results, PROMPTS)
    tokens = [r[0] for r in results]

    chunked, _ = _run(mamba2_path, max_num_batched_tokens=16)
    assert [r[0] for r in chunked] == tokens

    # 10 blocks of 16 tokens, each charged its share of a 128-token request's state:
    # the states of one request fit, so one runs at a time.
    share = -(-STATE_BYTES // (128 // 16))
    capped, info = _run(mamba2_path, kv_cache_memory_bytes=10 * share, max_model_len=128)
    assert info["slots"] == 1
    assert [r[0] for r in capped] == tokens
    assert info["held"] == {} and info["free_slots"] == 1

    assert_preempted_request_recomputes(mamba2_path, tokens)


def assert_preempted_request_recomputes(path: str, tokens: list[list[int]]) -> None:
    """Priority scheduling, 2 running: a better request arriving a few steps in preempts
    the worst running one, which later recomputes from a zeroed state slot."""
    from vllm import SamplingParams
    llm = LLM(model=path, dtype="float32", block_size=16, max_model_len=256, max_num_seqs=2,
              scheduling_policy="priority")
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    engine.add_request("low", {"prompt_token_ids": PROMPTS[3]}, params, priority=5)
    engine.add_request("lower", {"prompt_token_ids": PROMPTS[2]}, params, priority=9)
    for _ in range(4):
        engine.step()
    engine.add_request("high", {"prompt_token_ids": PROMPTS[1]}, params, priority=0)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    state = engine.engine_core.executor.worker.model_runner.state_cache
    assert finished["lower"].metrics.num_preemptions == 1
    assert [list(finished[r].outputs[0].token_ids) for r in ("high", "lower", "low")] == \
        tokens[1:]
    assert state.slot_of == {} and len(state._free) == 2
    engine.shutdown()
    del llm
    gc.collect()


def test_mamba_flags_state_dtype_and_refusals(mamba2_path, tmp_path):
    """--mamba-ssm-cache-dtype / --mamba-cache-dtype set the state dtypes (and so the
    bytes per request); snapshots (--mamba-block-size, --mamba-cache-mode all/align),
    speculative decoding and KV transfer are refused by name."""
    import argparse

    from vllm.engine.arg_utils import EngineArgs
    args = EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(
        ["--mamba-cache-dtype", "float16", "--mamba-ssm-cache-dtype", "float32"])
    assert (args.mamba_cache_dtype, args.mamba_ssm_cache_dtype) == ("float16", "float32")

    llm = LLM(model=mamba2_path, dtype="float32", block_size=16, max_model_len=128,
              max_num_seqs=2, mamba_cache_dtype="float16", mamba_ssm_cache_dtype="float32")
    conv, ssm = llm.llm_engine.engine_core.executor.worker.model_runner.state_cache.states[0]
    assert (conv.dtype, ssm.dtype) == (torch.float16, torch.float32)
    assert llm.llm_engine.engine_core.kv_cache_config.state_bytes_per_request() == \
        2 * (192 * 3 * 2 + 8 * 16 * 16 * 4)
    llm.llm_engine.shutdown()
    del llm
    gc.collect()

    common = dict(model=mamba2_path, dtype="float32", block_size=16, max_model_len=128)
    with pytest.raises(ValueError, match="mamba-block-size"):
        LLM(mamba_block_size=64, **common)
    with pytest.raises(ValueError, match="mamba-cache-mode"):
        LLM(mamba_cache_mode="align", **common)
    with pytest.raises(ValueError, match="Speculative decoding is not supported"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                "prompt_lookup_max": 3}, **common)
    with pytest.raises(ValueError, match="KV transfer"):
        LLM(kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                                "kv_connector_extra_config": {
                                    "shared_storage_path": str(tmp_path)}}, **common)
