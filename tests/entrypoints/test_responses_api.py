"""/v1/responses with the official openai client: create (full and streamed), retrieve,
previous_response_id, background + cancel, function tools, refusals. One tiny-model
server for the module (its store on: VLLM_ENABLE_RESPONSES_API_STORE=1); the answers
are checked against /v1/chat/completions. The store's own rules (off by default, bounded
in bytes) and input checks run on the app over a fake engine."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.entrypoints.test_cli_and_app import run_app
from vllm.entrypoints.openai.responses_store import (ResponsesStore, StoredResponse,
                                                     entry_bytes)

GREEDY = dict(temperature=0.0, max_output_tokens=8)
STORE_ON = "VLLM_ENABLE_RESPONSES_API_STORE"


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--served-model-name", "tiny",
                        "--dtype", "float32", "--max-model-len", "512",
                        "--kv-cache-memory-bytes", str(16 << 20)], env={STORE_ON: "1"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _chat_text(http, messages, max_tokens=8) -> str:
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens,
                                                "temperature": 0.0})
    return r.json()["choices"][0]["message"]["content"]


def test_create_full_and_retrieve(client, http):
    resp = client.responses.create(model="tiny", input="Say hello.",
                                   instructions="Be brief.", **GREEDY)
    assert resp.object == "response" and resp.status in ("completed", "incomplete")
    assert resp.output[0].type == "message"
    expected = _chat_text(http, [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Say hello."}])
    assert resp.output_text == expected
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"
    again = client.responses.retrieve(resp.id)
    assert again.id == resp.id and again.output_text == resp.output_text
    # The conversation continues from the stored one.
    follow = client.responses.create(model="tiny", input="And again.",
                                     previous_response_id=resp.id, **GREEDY)
    expected = _chat_text(http, [{"role": "user", "content": "Say hello."},
                                 {"role": "assistant", "content": resp.output_text},
                                 {"role": "user", "content": "And again."}])
    assert follow.output_text == expected and follow.previous_response_id == resp.id


def test_stream_events_match_full(client):
    full = client.responses.create(model="tiny", input="Count to three.", **GREEDY)
    events = list(client.responses.create(model="tiny", input="Count to three.", stream=True,
                                          **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == full.output_text
    for kind in ("response.output_item.added", "response.content_part.added",
                 "response.output_text.done", "response.content_part.done",
                 "response.output_item.done"):
        assert kind in kinds, kind
    final = events[-1].response
    assert final.output_text == full.output_text
    assert client.responses.retrieve(final.id).output_text == full.output_text


def test_store_false_background_and_cancel(client, http):
    unstored = client.responses.create(model="tiny", input="Hi", store=False, **GREEDY)
    assert http.get(f"/v1/responses/{unstored.id}").status_code == 404
    bg = client.responses.create(model="tiny", input="Tell a story.", background=True,
                                 temperature=0.0, max_output_tokens=200)
    assert bg.status == "queued" and bg.background
    cancelled = client.responses.cancel(bg.id)
    assert cancelled.status in ("cancelled", "completed", "incomplete")
    done = client.responses.create(model="tiny", input="Hi", background=True, **GREEDY)
    deadline = time.time() + 30
    while client.responses.retrieve(done.id).status in ("queued", "in_progress"):
        assert time.time() < deadline
        time.sleep(0.1)
    assert client.responses.retrieve(done.id).output_text
    sync = client.responses.create(model="tiny", input="Hi", **GREEDY)
    r = http.post(f"/v1/responses/{sync.id}/cancel")
    assert r.status_code == 400 and "synchronous" in r.json()["error"]["message"]


def test_function_tool_call(client):
    tool = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                           "required": ["city"]}}
    resp = client.responses.create(model="tiny", input="Weather in Paris?", tools=[tool],
                                   tool_choice={"type": "function", "name": "get_weather"},
                                   temperature=0.0, max_output_tokens=64)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    import json
    assert "city" in json.loads(calls[0].arguments)
    streamed = list(client.responses.create(
        model="tiny", input="Weather in Paris?", tools=[tool], stream=True,
        tool_choice={"type": "function", "name": "get_weather"}, temperature=0.0,
        max_output_tokens=64))
    args = "".join(e.delta for e in streamed
                   if e.type == "response.function_call_arguments.delta")
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == args == calls[0].arguments
    assert streamed[-1].response.output[-1].type == "function_call"
    # The tool's result goes back as input items.
    follow = client.responses.create(
        model="tiny", previous_response_id=resp.id, input=[{
            "type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
        **GREEDY)
    assert follow.status in ("completed", "incomplete")


def test_refusals_are_openai_errors(http):
    for body, param in [({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
                        ({"input": "x", "truncation": "auto"}, "truncation"),
                        ({"input": [{"type": "image", "url": "x"}]}, "input.0.type"),
                        ({"input": "x", "previous_response_id": "resp_missing"},
                         "previous_response_id")]:
        r = http.post("/v1/responses", json=body)
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["error"]["param"] == param, r.text
    assert http.get("/v1/responses/resp_nope").status_code == 404


def test_response_fields_as_vllm(http):
    """vLLM's Response: the request's own fields echoed as given (null when unset),
    tool_choice and service_tier "auto" by default, the sampling values in effect
    (temperature, top_p, max_output_tokens within the context), one-turn usage lists."""
    import json as jsonlib

    body = {"model": "tiny", "input": "Say hello."}
    full = http.post("/v1/responses", json=body).json()
    assert (full["metadata"], full["text"], full["reasoning"]) == (None, None, None)
    assert (full["tool_choice"], full["service_tier"], full["truncation"]) == \
        ("auto", "auto", "disabled")
    assert (full["top_logprobs"], full["max_tool_calls"], full["prompt"]) == (None, None, None)
    assert isinstance(full["top_p"], float) and isinstance(full["temperature"], float)
    usage = full["usage"]
    assert full["max_output_tokens"] == 512 - usage["input_tokens"]
    assert usage["input_tokens_details"]["input_tokens_per_turn"] == [usage["input_tokens"]]
    assert usage["input_tokens_details"]["cached_tokens_per_turn"] == \
        [usage["input_tokens_details"]["cached_tokens"]]
    assert usage["output_tokens_details"] == {
        "reasoning_tokens": 0, "tool_output_tokens": 0,
        "output_tokens_per_turn": [usage["output_tokens"]], "tool_output_tokens_per_turn": [0]}
    given = {**body, "metadata": {"a": "b"}, "text": {"format": {"type": "text"}},
             "tool_choice": "none", "top_p": 0.5, "temperature": 0.0, "max_output_tokens": 4}
    echoed = http.post("/v1/responses", json=given).json()
    for name in ("metadata", "text", "tool_choice", "top_p", "temperature",
                 "max_output_tokens"):
        assert echoed[name] == given[name], name
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        events = [jsonlib.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    assert events[0]["response"]["max_output_tokens"] == full["max_output_tokens"]
    assert events[-1]["response"]["usage"]["input_tokens_details"][
        "input_tokens_per_turn"] == [usage["input_tokens"]]


# ------------------------------------------------ the app over a fake engine, no server
def test_store_is_off_by_default_as_in_vllm(tokenizer, monkeypatch):
    monkeypatch.delenv(STORE_ON, raising=False)

    async def requests(client):
        made = await client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 3})
        got = await client.get(f"/v1/responses/{made.json()['id']}")
        follow = await client.post("/v1/responses", json={
            "input": "Again", "max_output_tokens": 3,
            "previous_response_id": made.json()["id"]})
        background = await client.post("/v1/responses", json={
            "input": "Hi", "max_output_tokens": 3, "background": True})
        return made, got, follow, background

    made, got, follow, background = run_app(tokenizer, [], requests)
    assert made.status_code == 200 and made.json()["store"] is False, made.text
    assert got.status_code == 404 and follow.status_code == 404, (got.text, follow.text)
    error = background.json()["error"]
    assert background.status_code == 400 and error["param"] == "background", error
    assert STORE_ON in error["message"] and error["code"] == 400


def test_store_is_bounded_in_bytes(tokenizer, monkeypatch):
    """Old responses are evicted by size; one larger than the whole bound is answered but
    not kept, and evicts nothing (the fake engine's context is short, so the bytes come
    from `metadata`: 16 values of 500 characters, ~9 kB per response)."""
    monkeypatch.setenv(STORE_ON, "1")
    heavy = {"input": "Hi", "max_output_tokens": 2,
             "metadata": {f"k{i}": "v" * 500 for i in range(16)}}

    async def fill(client):
        ids = []
        for _ in range(6):
            r = await client.post("/v1/responses", json=heavy)
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        return [(await client.get(f"/v1/responses/{i}")).status_code for i in ids]

    monkeypatch.setenv("VLLM_RESPONSES_API_STORE_MAX_BYTES", "30000")
    assert run_app(tokenizer, [], fill) == [404, 404, 404, 200, 200, 200]

    async def oversize(client):
        small = await client.post("/v1/responses", json={"input": "Hi",
                                                         "max_output_tokens": 2})
        big = await client.post("/v1/responses", json=heavy)
        big_background = await client.post("/v1/responses", json={**heavy,
                                                                   "background": True})
        return ((await client.get(f"/v1/responses/{small.json()['id']}")).status_code, big,
                (await client.get(f"/v1/responses/{big.json()['id']}")).status_code,
                big_background)

    monkeypatch.setenv("VLLM_RESPONSES_API_STORE_MAX_BYTES", "5000")
    small_kept, big, big_kept, big_background = run_app(tokenizer, [], oversize)
    assert small_kept == 200 and big.status_code == 200 and big_kept == 404, big.text
    assert big_background.status_code == 400, big_background.text
    assert big_background.json()["error"]["param"] == "background"


def test_store_evicts_oldest_first_and_cancels_evicted_background_work():
    def entry(size: int) -> StoredResponse:
        return StoredResponse({"id": "x", "status": "completed"},
                              [{"role": "user", "content": "a" * size}])

    size = entry_bytes(entry(1000))

    async def main():
        store = ResponsesStore(max_bytes=3 * size)
        running = asyncio.ensure_future(asyncio.sleep(60))
        first = entry(1000)
        first.task = running
        assert store.put("a", first)
        for name in "bcd":
            assert store.put(name, entry(1000))
        await asyncio.sleep(0)
        assert store.get("a") is None and running.cancelled()
        assert [store.get(n) is not None for n in "bcd"] == [True] * 3
        assert store.total_bytes == 3 * size
        assert not store.put("e", entry(4 * 1000))  # alone larger than the store
        assert len(store) == 3 and store.total_bytes == 3 * size
        assert store.put("c", entry(10))  # replacing an entry counts its new size only
        assert store.total_bytes == 2 * size + entry_bytes(entry(10))

    asyncio.run(main())


def test_function_call_output_needs_an_earlier_call(tokenizer, monkeypatch):
    monkeypatch.delenv(STORE_ON, raising=False)
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}

    async def requests(client):
        bodies = [[output], [output, call], [{"role": "user", "content": "Hi"}, call, output]]
        return [await client.post("/v1/responses", json={"input": b, "max_output_tokens": 2})
                for b in bodies]

    alone, before_its_call, answered = run_app(tokenizer, [], requests)
    for r in (alone, before_its_call):
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "input", r.text
        assert error["message"] == ("No tool call found for function call output with "
                                    "call_id call_1.")
    assert answered.status_code == 200, answered.text
