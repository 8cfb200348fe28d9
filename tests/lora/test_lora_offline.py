"""LoRA offline: each adapter gives peft's greedy tokens; mixed batches and swapping.

The reference is `peft` (adapters made with random A and B by peft itself, applied
to transformers' model of the same weights, unmerged). Adapters differ in rank,
targets (q/v only, MLP only, all seven), alpha, rsLoRA and rank/alpha patterns.
"""
from __future__ import annotations

import gc
import json
import os
import shutil

import pytest
import torch

from tests.lora.conftest import ADAPTERS, MAX_TOKENS, greedy, make_peft_adapter, peft_model
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
LORA_IDS = {name: i + 1 for i, (name, _) in enumerate(ADAPTERS)}


def _lora(adapters: dict, name):
    return None if name is None else LoRARequest(name, LORA_IDS[name], adapters[name])


def _generate(llm, prompt_ids, loras) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], GREEDY,
                        use_tqdm=False, lora_request=loras)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def llm(qwen2_base):
    """Two slots for five adapters: every multi-adapter test below swaps."""
    engine = LLM(qwen2_base, dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=16,
                 max_cpu_loras=3, kv_cache_memory_bytes=32 << 20, max_num_seqs=16)
    yield engine
    del engine
    gc.collect()


def test_each_adapter_matches_peft(llm, qwen2_adapters, qwen2_prompt_ids, qwen2_references):
    assert _generate(llm, qwen2_prompt_ids, None) == qwen2_references[None]
    for name in qwen2_adapters:
        got = _generate(llm, qwen2_prompt_ids, _lora(qwen2_adapters, name))
        assert got == qwen2_references[name], name
        # The adapter really changes the output (the test could fail).
        assert got != qwen2_references[None], name


def test_mixed_batch_base_and_three_adapters(llm, qwen2_adapters, qwen2_prompt_ids,
                                             qwen2_references):
    """One generate call: per prompt the base or one of three adapters; more distinct
    adapters than max_loras=2, so the scheduler splits them over steps and slots swap."""
    names = [None, "sql", "poet", "chat"]
    prompts, loras, expected = [], [], []
    for i, ids in enumerate(qwen2_prompt_ids):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            prompts.append(ids)
            loras.append(_lora(qwen2_adapters, name))
            expected.append(qwen2_references[name][i])
    manager = llm.llm_engine.engine_core.executor.worker.model_runner.lora_manager
    loads = manager.num_slot_loads
    assert _generate(llm, prompts, loras) == expected
    assert manager.num_slot_loads > loads


def test_more_adapters_than_slots_and_host_cache(llm, qwen2_adapters, qwen2_prompt_ids,
                                                 qwen2_references):
    """Five adapters, two slots, three host-cache entries: all served, twice over."""
    names = list(qwen2_adapters) * 2
    prompts = [qwen2_prompt_ids[i % len(qwen2_prompt_ids)] for i in range(len(names))]
    loras = [_lora(qwen2_adapters, n) for n in names]
    expected = [qwen2_references[n][i % len(qwen2_prompt_ids)] for i, n in enumerate(names)]
    assert _generate(llm, prompts, loras) == expected
    assert len(llm.llm_engine.list_loras()) <= 3 + 2


def test_prefix_cache_never_shared_across_adapters(llm, qwen2_adapters, qwen2_prompt_ids):
    """A prompt computed under an adapter leaves cached blocks that the base model (and
    other adapters) must not reuse, while the same adapter does reuse them."""
    long_prompt = sum(qwen2_prompt_ids, []) * 3  # several full blocks
    sql = _lora(qwen2_adapters, "sql")
    first = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False,
                         lora_request=sql)[0]
    again = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False,
                         lora_request=sql)[0]
    assert again.num_cached_tokens > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    for other in (None, _lora(qwen2_adapters, "poet")):
        out = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False,
                           lora_request=other)[0]
        assert out.num_cached_tokens == 0


def test_bad_adapters_are_refused_and_engine_keeps_serving(llm, qwen2_base, qwen2_adapters,
                                                           qwen2_prompt_ids, qwen2_references,
                                                           tmp_path, tiny_model_factory):
    def refused(lora: LoRARequest, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            llm.generate([{"prompt_token_ids": qwen2_prompt_ids[0]}], GREEDY, use_tqdm=False,
                         lora_request=lora)

    refused(LoRARequest("missing", 90, str(tmp_path / "nowhere")), "No adapter found")
    big = make_peft_adapter(qwen2_base, str(tmp_path / "big"), seed=0, r=32, lora_alpha=32,
                            target_modules=["q_proj"])
    refused(LoRARequest("big", 91, big), "rank 32 .* max_lora_rank=16")
    other_base = tiny_model_factory("qwen2", hidden_size=32)
    alien = make_peft_adapter(other_base, str(tmp_path / "alien"), seed=0, r=4, lora_alpha=8,
                              target_modules=["q_proj"])
    refused(LoRARequest("alien", 92, alien), "another base model")
    biased = str(tmp_path / "biased")
    shutil.copytree(qwen2_adapters["sql"], biased)
    with open(os.path.join(biased, "adapter_config.json")) as f:
        config = json.load(f)
    config["bias"] = "lora_only"
    with open(os.path.join(biased, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    refused(LoRARequest("biased", 93, biased), "bias")
    embed = make_peft_adapter(qwen2_base, str(tmp_path / "embed"), seed=0, r=4, lora_alpha=8,
                              target_modules=["embed_tokens", "q_proj"])
    refused(LoRARequest("embed", 94, embed), "embedding")
    no_weights = str(tmp_path / "no_weights")
    shutil.copytree(qwen2_adapters["sql"], no_weights)
    os.remove(os.path.join(no_weights, "adapter_model.safetensors"))
    refused(LoRARequest("no_weights", 95, no_weights), "No adapter found")
    # Nothing was queued and the good adapters still work.
    assert not llm.llm_engine.has_unfinished_requests()
    assert _generate(llm, qwen2_prompt_ids[:1], _lora(qwen2_adapters, "poet")) == \
        qwen2_references["poet"][:1]


def test_lora_refused_when_not_enabled(qwen2_base, qwen2_adapters, qwen2_prompt_ids):
    engine = LLM(qwen2_base, dtype="float32", kv_cache_memory_bytes=16 << 20)
    with pytest.raises(ValueError, match="enable_lora"):
        engine.generate([{"prompt_token_ids": qwen2_prompt_ids[0]}], GREEDY, use_tqdm=False,
                        lora_request=_lora(qwen2_adapters, "sql"))
    del engine
    gc.collect()


def test_config_validation(qwen2_base):
    with pytest.raises(ValueError, match="max_lora_rank"):
        LLM(qwen2_base, enable_lora=True, max_lora_rank=12)
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LLM(qwen2_base, enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("x", 0, "/some/path")


def test_default_model_adapter_matches_peft(default_model_path, tmp_path):
    """The embedded SmolLM2 with a peft adapter on all seven projections."""
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    base = resolve_model_path(DEFAULT_MODEL)
    path = make_peft_adapter(base, str(tmp_path / "smol"), seed=3, scale=8.0, r=16,
                             lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj",
                                                            "o_proj", "gate_proj", "up_proj",
                                                            "down_proj"])
    engine = LLM(dtype="float32", enable_lora=True, max_lora_rank=16, max_model_len=512,
                 kv_cache_memory_bytes=64 << 20)
    tok = engine.get_tokenizer()
    prompts = [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):")]
    lora = LoRARequest("smol", 1, path)
    got = _generate(engine, prompts, lora)
    base_out = _generate(engine, prompts, None)
    del engine
    gc.collect()
    reference = peft_model(base, path)
    assert got == [greedy(reference, ids, MAX_TOKENS) for ids in prompts]
    assert got != base_out


def test_load_inplace_swaps_the_weights_under_one_id(llm, qwen2_adapters, qwen2_prompt_ids,
                                                     qwen2_references, tmp_path):
    """An RL loop writes each step's adapter to one path: LoRARequest(load_inplace=True)
    reads it again (vLLM's field); without it the loaded weights stay, and no prefix-cache
    block computed with the old weights is reused after the swap."""
    path = tmp_path / "hot"
    shutil.copytree(qwen2_adapters["sql"], path)
    hot = LoRARequest("hot", 99, str(path))
    assert _generate(llm, qwen2_prompt_ids, hot) == qwen2_references["sql"]
    long_prompt = sum(qwen2_prompt_ids, []) * 3
    first = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False,
                         lora_request=hot)[0]
    shutil.rmtree(path)
    shutil.copytree(qwen2_adapters["poet"], path)
    assert _generate(llm, qwen2_prompt_ids, hot) == qwen2_references["sql"]  # not reread
    swapped = LoRARequest("hot", 99, str(path), load_inplace=True)
    assert _generate(llm, qwen2_prompt_ids, swapped) == qwen2_references["poet"]
    after = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False,
                         lora_request=hot)[0]
    assert after.num_cached_tokens == 0 and after.outputs[0].token_ids != \
        first.outputs[0].token_ids
    again = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False,
                         lora_request=hot)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == \
        after.outputs[0].token_ids
