"""The Transformers modeling backend (`--model-impl`): architectures with no native class
run through their `transformers` code with our linear layers and paged attention, and
give transformers' own greedy tokens."""
from __future__ import annotations

import logging

import pytest
import torch

PROMPTS = ["Hello, my name is", "The capital of France is a city that",
           "1, 2, 3, 4,"]
MAX_TOKENS = 16

BACKEND_ARCHS = ["olmo", "olmo2", "glm", "glm4", "cohere", "cohere2", "starcoder2", "phi",
                 "gptj", "smollm3", "exaone4", "helium", "ernie4_5", "seed_oss", "apertus",
                 "arcee", "gpt2", "opt", "hunyuan_v1_dense"]
"""No native class for any of these (tests/conftest.py _BACKEND_CONFIGS): dense, GQA,
sliding-window layers (cohere2, starcoder2, exaone4), soft logit scale (cohere), partial
rotary and parallel blocks (phi, gptj), learned positions (gpt2, opt), no-RoPE layers
(smollm3), tied embeddings (gpt2, opt)."""


def _hf_greedy(path: str) -> list[list[int]]:
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outs = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def _vllm_greedy(path: str, **kwargs) -> list[list[int]]:
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", max_model_len=256, **kwargs)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True), use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("arch", BACKEND_ARCHS)
def test_backend_greedy_matches_transformers(tiny_model_factory, arch):
    path = tiny_model_factory(arch)
    assert _vllm_greedy(path) == _hf_greedy(path)


def test_llama_forced_through_backend_matches_native(tiny_model_factory):
    path = tiny_model_factory("llama")
    native = _vllm_greedy(path, model_impl="vllm")
    assert _vllm_greedy(path, model_impl="transformers") == native
    assert native == _hf_greedy(path)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["llama", "olmo2", "glm4"])
def test_tp2_from_base_model_tp_plan_matches_transformers(tiny_model_factory, arch):
    """TP=2 over worker processes from the model's base_model_tp_plan: llama splits heads
    and MLP; glm4 splits heads and keeps its fused gate_up MLP whole; olmo2 (q/k norms
    over all heads) keeps attention whole and splits its MLP."""
    path = tiny_model_factory(arch)
    got = _vllm_greedy(path, tensor_parallel_size=2, distributed_executor_backend="mp",
                       model_impl="transformers", kv_cache_memory_bytes=32 << 20)
    assert got == _hf_greedy(path)


def test_auto_logs_fallback_once(tiny_model_factory, caplog):
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.model_executor.models.transformers import TransformersForCausalLM
    from vllm.transformers_utils.config import create_model_config
    config = create_model_config(model=tiny_model_factory("olmo2"), dtype="float32")
    assert config.model_impl == "auto"
    with caplog.at_level(logging.INFO, logger="vllm.model_executor.models.registry"):
        cls, arch = ModelRegistry.resolve_model_cls(config.architectures, config)
    assert cls is TransformersForCausalLM and arch == "Olmo2ForCausalLM"
    lines = [r.getMessage() for r in caplog.records if "Transformers modeling backend" in
             r.getMessage()]
    assert len(lines) == 1, lines
    config.model_impl = "vllm"
    with pytest.raises(ValueError, match="--model-impl auto or transformers"):
        ModelRegistry.resolve_model_cls(config.architectures, config)


def test_model_impl_choices_validated():
    from vllm.config import ModelConfig
    from vllm.engine.arg_utils import EngineArgs
    with pytest.raises(ValueError, match="model_impl='hf'"):
        ModelConfig(model_impl="hf")
    import argparse
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    assert parser.parse_args(["--model-impl", "transformers"]).model_impl == "transformers"


@pytest.mark.parametrize("config_kwargs, reason", [
    (dict(cls="T5Config"), "encoder-decoder"),
    (dict(cls="StableLmConfig"), "attention interface"),
    (dict(cls="PretrainedConfig", model_type="my_remote_lm",
          architectures=["MyRemoteLMForCausalLM"],
          auto_map={"AutoModelForCausalLM": "modeling_my.MyRemoteLMForCausalLM"}),
     "remote code"),
])
def test_refusals_name_the_reason(config_kwargs, reason):
    import transformers
    from vllm.model_executor.models.transformers import (TransformersBackendUnsupported,
                                                         resolve_transformers_class)
    kwargs = dict(config_kwargs)
    config = getattr(transformers, kwargs.pop("cls"))()
    for key, value in kwargs.items():
        setattr(config, key, value)
    with pytest.raises(TransformersBackendUnsupported, match=reason) as info:
        resolve_transformers_class(config)
    assert "--model-impl" in str(info.value)


def test_served_request_with_model_impl_auto(tiny_model_factory):
    import openai
    from tests.entrypoints.conftest import RemoteServer
    path = tiny_model_factory("cohere2")
    expected = _hf_greedy(path)[0]
    srv = RemoteServer(["--model", path, "--dtype", "float32", "--max-model-len", "256",
                        "--model-impl", "auto", "--kv-cache-memory-bytes", str(64 << 20)])
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        kwargs = dict(model=path, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                      extra_body={"ignore_eos": True, "return_token_ids": True})
        full = client.completions.create(**kwargs)
        streamed = "".join(c.choices[0].text for c in
                           client.completions.create(stream=True, **kwargs))
        assert full.choices[0].text == streamed
        ids = getattr(full.choices[0], "token_ids", None)
        if ids is not None:
            assert list(ids) == expected
        assert "Transformers modeling backend" in srv.tail(200)
    finally:
        srv.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["olmo2", "cohere2"])
def test_pp2_from_base_model_pp_plan_matches_transformers(tiny_model_factory, arch):
    """Two pipeline stages over worker processes: each holds its decoder layers (the
    rest pass hidden states through), the embedding on the first, the norm and LM head on
    the last; cohere2 mixes sliding and full layers across the stages."""
    path = tiny_model_factory(arch)
    got = _vllm_greedy(path, pipeline_parallel_size=2, distributed_executor_backend="mp",
                       model_impl="transformers", kv_cache_memory_bytes=32 << 20)
    assert got == _hf_greedy(path)


def test_pp_without_a_pp_plan_is_refused_by_name(tiny_model_factory):
    """GPT-2 names no embed_tokens / layers / norm for a pipeline: the worker's refusal
    reaches the caller as the ValueError it is (not as a worker death)."""
    from vllm.model_executor.models.transformers import TransformersBackendUnsupported
    with pytest.raises(TransformersBackendUnsupported,
                       match="base_model_pp_plan.*--pipeline-parallel-size 1"):
        _vllm_greedy(tiny_model_factory("gpt2"), pipeline_parallel_size=2,
                     distributed_executor_backend="mp", model_impl="transformers",
                     kv_cache_memory_bytes=32 << 20)


@pytest.mark.parametrize("arch", ["olmo2", "cohere2", "gpt2"])
def test_backend_top5_logprobs_close_to_transformers(tiny_model_factory, arch):
    """Beyond equal tokens: every step's top-5 logprobs within 1e-3 of transformers'
    (a dense GQA model, sliding + full layers with a logit scale, learned positions)."""
    from tests.models.test_breadth_hf import assert_matches_transformers, run_engine
    path = tiny_model_factory(arch)
    prompts, results = run_engine(path, model_impl="transformers")
    assert_matches_transformers(path, results, prompts)


def test_default_gguf_model_through_backend_matches_native():
    """SmolLM2-135M-Instruct, the embedded GGUF, forced through the backend gives the
    native path's greedy tokens."""
    from vllm import LLM, SamplingParams
    from vllm.config import DEFAULT_MODEL
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    for impl in ("vllm", "transformers"):
        llm = LLM(model=DEFAULT_MODEL, dtype="float32", max_model_len=256, model_impl=impl,
                  kv_cache_memory_bytes=32 << 20)
        try:
            outs[impl] = [list(o.outputs[0].token_ids)
                          for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        finally:
            llm.llm_engine.shutdown()
    assert outs["transformers"] == outs["vllm"]
