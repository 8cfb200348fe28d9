"""/v1/responses with the official openai client: create (full and streamed), retrieve,
previous_response_id, background + cancel, function tools, refusals. One tiny-model
server for the module; the answers are checked against /v1/chat/completions."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer

GREEDY = dict(temperature=0.0, max_output_tokens=8)


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--served-model-name", "tiny",
                        "--dtype", "float32", "--max-model-len", "512",
                        "--kv-cache-memory-bytes", str(16 << 20)])
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
