"""The Anthropic Messages API against the official `anthropic` SDK (real server, tiny
random-weight model with the default model's tokenizer and chat template).

A message, a streamed message (the same greedy text), a tool-use round trip (the
tool_use block's input validates against the tool's schema; a tool_result is
accepted), count_tokens (the rendered prompt's length), stop sequences, and bad
requests getting Anthropic's error types; the x-api-key header authenticates.
"""
from __future__ import annotations

import signal

import httpx
import jsonschema
import pytest

from tests.entrypoints.conftest import RemoteServer

anthropic = pytest.importorskip("anthropic")

API_KEY = "anthropic-test-key"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": WEATHER}]
HI = [{"role": "user", "content": "Hello there, how are you?"}]
GREEDY = {"temperature": 0.0}
"""The current SDK has no temperature argument; the API takes the field."""


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--dtype", "float32",
                        "--max-model-len", "512", "--max-num-seqs", "8",
                        "--kv-cache-memory-bytes", str(32 << 20), "--disable-log-requests",
                        "--api-key", API_KEY,
                        # Compact JSON: a random-weight model would fill its tool calls'
                        # allowed whitespace up to max_tokens.
                        "--structured-outputs-config", '{"disable_any_whitespace": true}'])
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0,
                               timeout=120)


@pytest.fixture(scope="module")
def model(server):
    r = httpx.get(server.url + "/v1/models", headers={"x-api-key": API_KEY})
    return r.json()["data"][0]["id"]


def test_message_and_stream_agree(client, model):
    message = client.messages.create(model=model, max_tokens=12, messages=HI,
                                     system="Be brief.", extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 12
    with client.messages.stream(model=model, max_tokens=12, messages=HI,
                                system="Be brief.", extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == message.content[0].text
    assert final.content[0].text == streamed
    assert final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens


def test_tool_use_round_trip(client, model):
    message = client.messages.create(model=model, max_tokens=64, messages=[
        {"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY)
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use"
    assert uses[0].name == "get_weather" and uses[0].id
    jsonschema.validate(uses[0].input, WEATHER)
    follow = client.messages.create(model=model, max_tokens=8, tools=TOOLS, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": message.content},  # as an agent loop does
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "Sunny, 21 C"}]}],
        tool_choice={"type": "none"})
    assert follow.content and follow.content[0].type == "text"


def test_streamed_tool_use(client, model):
    with client.messages.stream(model=model, max_tokens=64, messages=[
            {"role": "user", "content": "Weather in Rome?"}], tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER)


def test_count_tokens_is_the_rendered_prompt(client, model, server):
    counted = client.messages.count_tokens(model=model, messages=HI, system="Be brief.")
    rendered = httpx.post(server.url + "/tokenize", headers={"x-api-key": API_KEY},
                          json={"model": model, "messages": [
                              {"role": "system", "content": "Be brief."}, *HI]}).json()
    assert counted.input_tokens == rendered["count"] > 0


def test_stop_sequence(client, model):
    text = client.messages.create(model=model, max_tokens=16, messages=HI,
                                  extra_body=GREEDY).content[0].text
    stop = text.strip()[3:8]
    assert stop
    stopped = client.messages.create(model=model, max_tokens=16, messages=HI,
                                     extra_body=GREEDY, stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stop not in stopped.content[0].text


def test_output_format_is_a_json_schema_constraint(client, model):
    import json
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}},
              "required": ["answer"], "additionalProperties": False}
    message = client.messages.create(model=model, max_tokens=40, messages=HI,
                                     output_config={"format": {"type": "json_schema",
                                                               "schema": schema}},
                                     extra_body=GREEDY)
    jsonschema.validate(json.loads(message.content[0].text), schema)


def test_errors_in_anthropic_shape(client, model, server):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=model, max_tokens=0, messages=HI)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=model, max_tokens=4, messages=HI,
                               extra_body={"bogus_field": 1})
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(model=model, max_tokens=4, messages=HI,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError, match="effort"):
        client.messages.create(model=model, max_tokens=4, messages=HI,
                               output_config={"effort": "high"})
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=4, messages=HI)
    bad_key = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad_key.messages.create(model=model, max_tokens=4, messages=HI)
    assert info.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": API_KEY},
                   content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": API_KEY}, timeout=30,
                   content=b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", '
                           b'"content": "\\ud800"}]}')
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
