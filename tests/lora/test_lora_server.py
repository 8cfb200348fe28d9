"""LoRA over the OpenAI server: adapters by model name (openai client), /v1/models,
runtime load/unload with vLLM's bodies and status codes, bad adapters refused while
the others keep serving, and the vllm:lora_requests_info metric."""
from __future__ import annotations

import asyncio
import json
import os

import httpx
import openai
import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.lora.conftest import MAX_TOKENS, make_peft_adapter

BASE = "tiny-base"


@pytest.fixture(scope="module")
def server(qwen2_base, qwen2_adapters):
    poet = json.dumps({"name": "poet", "path": qwen2_adapters["poet"],
                       "base_model_name": BASE})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
        srv = RemoteServer(["--model", qwen2_base, "--served-model-name", BASE, "--dtype",
                            "float32", "--enable-lora", "--max-loras", "2", "--max-lora-rank",
                            "16", "--lora-modules", f"sql={qwen2_adapters['sql']}", poet,
                            "--kv-cache-memory-bytes", str(32 << 20),
                            "--return-tokens-as-token-ids", "--disable-log-requests"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _tokens(client, model: str, prompt_ids: list[int]) -> list[int]:
    out = client.completions.create(model=model, prompt=prompt_ids, max_tokens=MAX_TOKENS,
                                    temperature=0, logprobs=0, extra_body={"ignore_eos": True})
    assert out.model == model
    return [int(t.removeprefix("token_id:")) for t in out.choices[0].logprobs.tokens]


def test_models_list_adapters_with_parent(client, qwen2_adapters):
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {BASE, "sql", "poet"}
    assert cards["sql"].parent == BASE and cards["sql"].root == qwen2_adapters["sql"]
    assert cards["poet"].parent == BASE and cards["poet"].root == qwen2_adapters["poet"]
    assert cards[BASE].parent is None


def test_adapter_selected_by_model_name(client, qwen2_prompt_ids, qwen2_references):
    for model, ref in ((BASE, None), ("sql", "sql"), ("poet", "poet")):
        assert _tokens(client, model, qwen2_prompt_ids[0]) == qwen2_references[ref][0], model
    chat = client.chat.completions.create(model="poet", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.model == "poet" and chat.choices[0].message.content is not None


def test_concurrent_mix_of_base_and_adapters(server, qwen2_prompt_ids, qwen2_references):
    """Base and two adapters at once, several prompts each: one batch, per-row adapters."""
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                                timeout=120)
    jobs = [(model, ref, i) for model, ref in ((BASE, None), ("sql", "sql"), ("poet", "poet"))
            for i in range(len(qwen2_prompt_ids))]

    async def one(model, i):
        out = await client.completions.create(
            model=model, prompt=qwen2_prompt_ids[i], max_tokens=MAX_TOKENS, temperature=0,
            logprobs=0, extra_body={"ignore_eos": True})
        return [int(t.removeprefix("token_id:")) for t in out.choices[0].logprobs.tokens]

    async def run():
        return await asyncio.gather(*(one(model, i) for model, _, i in jobs))

    results = asyncio.run(run())
    for (model, ref, i), got in zip(jobs, results):
        assert got == qwen2_references[ref][i], (model, i)


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)


def test_runtime_load_and_unload(server, client, qwen2_base, qwen2_adapters, qwen2_prompt_ids,
                                 qwen2_references, tmp_path):
    http = httpx.Client(base_url=server.url, timeout=120)
    load = "/v1/load_lora_adapter"
    r = http.post(load, json={"lora_name": "chat", "lora_path": qwen2_adapters["chat"]})
    assert r.status_code == 200 and "added successfully" in r.text
    assert "chat" in {m.id for m in client.models.list().data}
    assert _tokens(client, "chat", qwen2_prompt_ids[1]) == qwen2_references["chat"][1]
    # vLLM's refusals: duplicate name 400, missing adapter 404, bad body 400.
    r = http.post(load, json={"lora_name": "chat", "lora_path": qwen2_adapters["chat"]})
    assert r.status_code == 400 and "already been loaded" in r.json()["error"]["message"]
    r = http.post(load, json={"lora_name": "ghost", "lora_path": str(tmp_path / "none")})
    assert r.status_code == 404 and "No adapter found" in r.json()["error"]["message"]
    r = http.post(load, json={"lora_name": "", "lora_path": ""})
    assert r.status_code == 400
    big = make_peft_adapter(qwen2_base, str(tmp_path / "big"), seed=1, r=32, lora_alpha=16,
                            target_modules=["v_proj"])
    r = http.post(load, json={"lora_name": "big", "lora_path": big})
    assert r.status_code == 400 and "max_lora_rank" in r.json()["error"]["message"]
    assert "big" not in {m.id for m in client.models.list().data}
    # The others keep serving.
    assert _tokens(client, "sql", qwen2_prompt_ids[2]) == qwen2_references["sql"][2]
    unload = "/v1/unload_lora_adapter"
    r = http.post(unload, json={"lora_name": "chat"})
    assert r.status_code == 200 and "removed successfully" in r.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="chat", prompt="hi", max_tokens=2)
    r = http.post(unload, json={"lora_name": "chat"})
    assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
    # Loading it again (new id) works.
    r = http.post(load, json={"lora_name": "chat", "lora_path": qwen2_adapters["chat"]})
    assert r.status_code == 200
    assert _tokens(client, "chat", qwen2_prompt_ids[0]) == qwen2_references["chat"][0]


def test_load_inplace_swaps_an_adapter(server, client, qwen2_adapters, qwen2_prompt_ids,
                                       qwen2_references, tmp_path):
    """vLLM's load_inplace: the same name (and id) with another adapter's weights."""
    http = httpx.Client(base_url=server.url, timeout=120)
    load = "/v1/load_lora_adapter"
    r = http.post(load, json={"lora_name": "swap", "lora_path": qwen2_adapters["sql"]})
    assert r.status_code == 200, r.text
    assert _tokens(client, "swap", qwen2_prompt_ids[0]) == qwen2_references["sql"][0]
    r = http.post(load, json={"lora_name": "swap", "lora_path": qwen2_adapters["poet"],
                              "load_inplace": True})
    assert r.status_code == 200, r.text
    assert _tokens(client, "swap", qwen2_prompt_ids[0]) == qwen2_references["poet"][0]
    assert _tokens(client, "swap", qwen2_prompt_ids[1]) == qwen2_references["poet"][1]
    assert [m.id for m in client.models.list().data].count("swap") == 1


def test_lora_info_metric(server, client):
    text = httpx.get(server.url + "/metrics", timeout=30).text
    lines = [l for l in text.splitlines() if l.startswith("vllm:lora_requests_info{")]
    assert lines and 'max_lora="2"' in lines[0]
    assert "running_lora_adapters=" in lines[0] and "waiting_lora_adapters=" in lines[0]


def test_lora_modules_flag_parsing():
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    parser = make_arg_parser()
    args = parser.parse_args(["--enable-lora", "--lora-modules", "a=/x",
                              '{"name": "b", "path": "/y", "base_model_name": "m"}'])
    assert [(m.name, m.path, m.base_model_name) for m in args.lora_modules] == [
        ("a", "/x", None), ("b", "/y", "m")]
    with pytest.raises(SystemExit):
        parser.parse_args(["--lora-modules", "no-equals-sign"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--lora-modules", '{"name": "b"}'])
    args = parser.parse_args(["--lora-modules", "a=/x"])
    with pytest.raises(ValueError, match="--enable-lora"):
        validate_parsed_serve_args(args)
