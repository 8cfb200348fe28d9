"""KV connectors offline: a producer LLM and a consumer LLM give the greedy outputs of
one instance, the consumer computing only each prompt's last token (ExampleConnector
through files on CPU; P2pZmqConnector over TCP on the fake HPU, with no compile after
warmup); the config and the request parameters are checked with clear errors."""
from __future__ import annotations

import gc
import json

import pytest

from tests.entrypoints.conftest import free_port
from tests.hpu.conftest import (SMALL_BUCKETS, make_llm, platform_env, ragged_prompt_ids,
                                release, runner_of)
from vllm import SamplingParams
from vllm.kv_transfer import KVTransferConfig
from vllm.kv_transfer.example_connector import entry_key

LENGTHS = [3, 9, 16, 17, 31, 40, 55, 64, 70, 12, 33, 47, 90, 100, 21, 5]
"""16 prompts: one-token, block-aligned (16, 64) and partial last blocks."""
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
ARGS = dict(max_model_len=512, max_num_seqs=16, block_size=16)


def _example(role: str, root) -> dict:
    return {"kv_connector": "ExampleConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(root)}}


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _run(llm, prompts, params):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("value, message", [
    ({"kv_role": "kv_both"}, "kv_connector is required"),
    ({"kv_connector": "Nope", "kv_role": "kv_both"}, "kv_connector='Nope'"),
    ({"kv_connector": "ExampleConnector", "kv_role": "decoder",
      "kv_connector_extra_config": {"shared_storage_path": "/tmp/x"}}, "kv_role"),
    ({"kv_connector": "ExampleConnector", "kv_role": "kv_both"}, "shared_storage_path"),
    ({"kv_connector": "P2pZmqConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"timeout": 3}}, "unknown key(s) ['timeout']"),
    ({"kv_connector": "P2pZmqConnector", "kv_role": "kv_both", "kv_port": 0}, "kv_port"),
    ({"kv_connector": "P2pZmqConnector", "kv_role": "kv_both", "kv_rank": 0},
     "unknown key(s) ['kv_rank']"),
    ('{"kv_connector": ', "must be JSON"),
])
def test_config_errors_name_the_field(value, message):
    with pytest.raises(ValueError, match=None) as err:
        KVTransferConfig.from_cli(value)
    assert message in str(err.value)


def test_cli_flag_parses_json():
    import argparse
    from vllm.engine.arg_utils import EngineArgs
    args = EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(
        ["--kv-transfer-config", '{"kv_connector": "P2pZmqConnector", "kv_role": '
         '"kv_consumer"}'])
    config = KVTransferConfig.from_cli(EngineArgs.from_cli_args(args).kv_transfer_config)
    assert config.is_kv_consumer and not config.is_kv_producer


# --------------------------------------------------------- ExampleConnector
def test_example_connector_pair_equals_one_instance(tiny_model_factory, tmp_path):
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        # The producer chunks its prompts (48 tokens a step): each is saved with its
        # last chunk, from the blocks of all its chunks.
        producer = make_llm(model=path, kv_transfer_config=_example("kv_producer", tmp_path),
                            max_num_batched_tokens=48, **ARGS)
        try:
            prompts = ragged_prompt_ids(producer.get_tokenizer(), LENGTHS)
            reference = _tokens(_run(producer, prompts, GREEDY))  # and saves every prompt
            with pytest.raises(ValueError, match="kv_role is kv_producer"):
                producer.generate("hi", SamplingParams(extra_args={"kv_transfer_params": {
                    "do_remote_prefill": True}}))
        finally:
            release(producer)
        consumer = make_llm(model=path, kv_transfer_config=_example("kv_consumer", tmp_path),
                            **ARGS)
        try:
            outputs = _run(consumer, prompts, GREEDY)
            assert _tokens(outputs) == reference
            assert len({tuple(t) for t in reference}) > 1  # outputs depend on the prompt
            assert [o.num_external_computed_tokens for o in outputs] == [n - 1 for n in LENGTHS]
            # vLLM counts connector-loaded tokens as cached (local + external).
            assert [o.num_cached_tokens for o in outputs] == [n - 1 for n in LENGTHS]
            # A prompt nobody saved is computed here; one whose entry is broken (a layer
            # file missing) ends with finish reason "error", and the engine goes on.
            fresh = ragged_prompt_ids(consumer.get_tokenizer(), [20, 24], seed=7)
            assert _run(consumer, fresh[:1], GREEDY)[0].num_external_computed_tokens == 0
            key = entry_key(path, fresh[1])
            (tmp_path / key / "rank0").mkdir(parents=True)
            (tmp_path / key / "rank0" / "meta.json").write_text(json.dumps(
                {"num_tokens": 24, "token_hash": key}))
            broken = _run(consumer, fresh[1:], GREEDY)[0].outputs[0]
            assert broken.finish_reason == "error" and broken.token_ids == []
            assert _tokens(_run(consumer, prompts[:2], GREEDY)) == reference[:2]
        finally:
            release(consumer)


def test_kv_transfer_params_need_a_connector(tiny_model_factory):
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        llm = make_llm(model=path, **ARGS)
        try:
            params = SamplingParams(max_tokens=2, extra_args={
                "kv_transfer_params": {"do_remote_decode": True}})
            with pytest.raises(ValueError, match="kv-transfer-config"):
                llm.generate("hello", params, use_tqdm=False)
        finally:
            release(llm)


# ------------------------------------------------- P2pZmqConnector, fake HPU
def test_p2p_pair_on_fake_hpu_equals_one_instance_without_compiles(tiny_model_factory):
    path = tiny_model_factory("llama")
    port = free_port()
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1")
    producer_config = {"kv_connector": "P2pZmqConnector", "kv_role": "kv_producer",
                       "kv_port": port}
    consumer_config = {"kv_connector": "P2pZmqConnector", "kv_role": "kv_consumer",
                       "kv_connector_extra_config": {"timeout_s": 10}}
    hpu_args = dict(ARGS, max_num_seqs=4, kv_cache_memory_bytes=4 << 20)  # warmed buckets
    with platform_env("hpu", **env):
        producer = make_llm(model=path, kv_transfer_config=producer_config, **hpu_args)
        consumer = None
        try:
            consumer = make_llm(model=path, kv_transfer_config=consumer_config, **hpu_args)
            prompts = ragged_prompt_ids(producer.get_tokenizer(), LENGTHS)
            reference = _tokens(_run(producer, prompts, GREEDY))
            prefill = SamplingParams(temperature=0.0, max_tokens=1, extra_args={
                "kv_transfer_params": {"do_remote_decode": True}})
            firsts = _run(producer, prompts, prefill)
            decode = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                     extra_args={"kv_transfer_params": o.kv_transfer_params})
                      for o in firsts]
            outputs = _run(consumer, prompts, decode)
            assert _tokens(outputs) == reference
            assert [o.num_external_computed_tokens for o in outputs] == [n - 1 for n in LENGTHS]
            tracker = runner_of(consumer).tracker
            assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
            # Fetched once: a second decode of the same KV fails cleanly (finish "error").
            again = _run(consumer, prompts[:1], decode[:1])[0]
            assert again.outputs[0].finish_reason == "error"
            assert again.outputs[0].token_ids == []
        finally:
            if consumer is not None:
                release(consumer)
            release(producer)
    gc.collect()


def test_example_connector_with_tensor_parallelism(tiny_model_factory, tmp_path):
    """TP=2: each rank saves and loads its own shard of the heads (rank<r>/)."""
    path = tiny_model_factory("llama")
    args = dict(ARGS, tensor_parallel_size=2, kv_cache_memory_bytes=8 << 20)
    with platform_env("cpu"):
        producer = make_llm(model=path, kv_transfer_config=_example("kv_producer", tmp_path),
                            **args)
        try:
            prompts = ragged_prompt_ids(producer.get_tokenizer(), LENGTHS[:8])
            reference = _tokens(_run(producer, prompts, GREEDY))
        finally:
            release(producer)
        entry = next(p for p in tmp_path.iterdir() if not p.name.startswith("."))
        assert sorted(p.name for p in entry.iterdir()) == ["rank0", "rank1"]
        consumer = make_llm(model=path, kv_transfer_config=_example("kv_consumer", tmp_path),
                            **args)
        try:
            outputs = _run(consumer, prompts, GREEDY)
            assert _tokens(outputs) == reference
            assert [o.num_external_computed_tokens for o in outputs] == \
                [n - 1 for n in LENGTHS[:8]]
        finally:
            release(consumer)


def test_send_buffer_bounds_bytes_and_age(monkeypatch):
    """A producer keeps unfetched KV within kv_buffer_size bytes and ttl_s seconds,
    oldest first, and hands each entry out once."""
    import torch
    from vllm.kv_transfer import p2p_zmq_worker
    now = [100.0]
    monkeypatch.setattr(p2p_zmq_worker.time, "monotonic", lambda: now[0])
    buffer = p2p_zmq_worker.KVSendBuffer(max_bytes=2 * 4096, ttl_s=10.0)
    layer = lambda: {"layers.0": torch.zeros(1024)}  # 4096 bytes
    for key in ("a", "b", "c"):
        buffer.put(key, [1, 2], "", layer())
    assert buffer.take("a") is None and len(buffer) == 2  # over the byte bound: oldest out
    assert buffer.take("b") is not None and buffer.take("b") is None  # handed out once
    now[0] += 11.0
    assert buffer.take("c") is None and len(buffer) == 0  # expired
