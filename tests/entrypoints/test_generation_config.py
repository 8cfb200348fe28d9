"""Default sampling parameters from the model's generation config, as vLLM:
--generation-config auto|vllm|<dir>, --override-generation-config, used by
LLM.get_default_sampling_params, LLM.generate / LLM.chat without params and the server."""
from __future__ import annotations

import json
import os

import pytest

from tests.entrypoints.conftest import RemoteServer

GREEDY_4 = {"temperature": 0.0, "max_new_tokens": 4, "top_k": 5}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory, tmp_path_factory) -> str:
    """A tiny llama whose generation_config.json asks for greedy, 4-token outputs."""
    src = tiny_model_factory("llama")
    path = tmp_path_factory.mktemp("genconfig-model")
    for name in os.listdir(src):
        os.symlink(os.path.join(src, name), path / name)
    (path / "generation_config.json").unlink(missing_ok=True)
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, **GREEDY_4, "top_p": 0.9,
         "repetition_penalty": 1.0}))
    return str(path)


def _model_config(model: str, **kw):
    from vllm.transformers_utils.config import create_model_config
    return create_model_config(model=model, max_model_len=256, **kw)


def test_model_config_sources(model_dir, tmp_path):
    auto = _model_config(model_dir).get_diff_sampling_param()
    assert auto == {"temperature": 0.0, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.0,
                    "max_tokens": 4}
    assert _model_config(model_dir, generation_config="vllm").get_diff_sampling_param() == {}
    over = _model_config(model_dir, generation_config="vllm",
                         override_generation_config={"temperature": 0.3, "do_sample": True})
    assert over.get_diff_sampling_param() == {"temperature": 0.3}
    merged = _model_config(model_dir, override_generation_config={"max_new_tokens": 9})
    assert merged.get_diff_sampling_param()["max_tokens"] == 9
    other = tmp_path / "gen"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"min_p": 0.05}))
    assert _model_config(model_dir, generation_config=str(other)).get_diff_sampling_param() \
        == {"min_p": 0.05}
    with pytest.raises(ValueError, match="generation_config="):
        _model_config(model_dir, generation_config=str(tmp_path / "missing"))


def test_offline_generate_and_chat_use_the_model_defaults(model_dir):
    from vllm import LLM, SamplingParams
    llm = LLM(model_dir, max_model_len=256, kv_cache_memory_bytes=16 << 20, dtype="float32")
    try:
        defaults = llm.get_default_sampling_params()
        # (greedy: top_k / top_p are then reset, as vLLM's SamplingParams does)
        assert (defaults.temperature, defaults.max_tokens) == (0.0, 4)
        explicit = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        expected = llm.generate([PROMPT], explicit, use_tqdm=False)[0].outputs[0]
        got = llm.generate([PROMPT], use_tqdm=False)[0].outputs[0]
        assert len(got.token_ids) <= 4
        assert list(got.token_ids) == list(expected.token_ids)[:len(got.token_ids)]
        messages = [{"role": "user", "content": "Hello"}]
        chat = llm.chat(messages, use_tqdm=False)[0].outputs[0]
        chat_greedy = llm.chat(messages, explicit, use_tqdm=False)[0].outputs[0]
        assert list(chat.token_ids) == list(chat_greedy.token_ids)[:len(chat.token_ids)]
        assert len(chat.token_ids) <= 4
    finally:
        llm.llm_engine.shutdown()
    llm = LLM(model_dir, max_model_len=256, kv_cache_memory_bytes=16 << 20, dtype="float32",
              generation_config="vllm")
    try:
        plain = llm.get_default_sampling_params()
        assert (plain.temperature, plain.max_tokens) == (1.0, 16)
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def server(model_dir):
    srv = RemoteServer(["--model", model_dir, "--dtype", "float32", "--max-model-len", "256",
                        "--kv-cache-memory-bytes", str(16 << 20), "--generation-config", "vllm",
                        "--override-generation-config",
                        json.dumps({"temperature": 0.0, "max_new_tokens": 3})])
    yield srv
    srv.stop()


def test_server_uses_overrides(server, model_dir):
    import httpx
    with httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"model": model_dir, "prompt": PROMPT, "ignore_eos": True}
        default = http.post("/v1/completions", json=body).json()
        greedy = http.post("/v1/completions", json={**body, "temperature": 0.0,
                                                     "max_tokens": 3}).json()
        assert default["usage"]["completion_tokens"] == 3  # capped by max_new_tokens
        assert default["choices"][0]["text"] == greedy["choices"][0]["text"]
        chat = {"model": model_dir, "messages": [{"role": "user", "content": "Hi"}],
                "ignore_eos": True}
        first = http.post("/v1/chat/completions", json=chat).json()
        second = http.post("/v1/chat/completions", json=chat).json()
        assert first["usage"]["completion_tokens"] == 3
        assert first["choices"][0]["message"] == second["choices"][0]["message"]  # greedy
