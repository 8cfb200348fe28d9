"""Client mistakes are 4xx with the OpenAI error body, never 500 (app over a fake engine).

Non-JSON Content-Type, lone surrogates in any string (also on /tokenize and streaming),
request-supplied chat templates without --trust-request-chat-template, and
truncate_prompt_tokens values that cannot be honoured.
"""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.entrypoints.test_cli_and_app import run_app

MSGS = [{"role": "user", "content": "Hi"}]
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def assert_error(response: httpx.Response, status: int, param: Any = ...) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["message"] and error["type"]
    if param is not ...:
        assert error["param"] == param, error
    return error


def test_non_json_content_type_is_400(tokenizer):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    plain = {"Content-Type": "text/plain"}
    body = b'{"prompt": "Hello", "max_tokens": 2}'

    async def requests(client):
        return ([await client.post(route, content=body, headers=headers)
                 for route in ("/v1/completions", "/v1/chat/completions", "/tokenize")
                 for headers in (form, plain)],
                await client.post("/v1/completions", content=body),  # no Content-Type
                await client.post("/v1/completions", content=body,
                                  headers={"Content-Type": "application/json; charset=utf-8"}))

    refused, no_type, with_charset = run_app(tokenizer, [], requests)
    for r in refused:
        assert "Content-Type" in assert_error(r, 400)["message"]
    assert no_type.status_code == 200, no_type.text  # read as JSON, as before
    assert with_charset.status_code == 200, with_charset.text


def test_lone_surrogates_are_400_everywhere(tokenizer):
    bad = '"\\ud800 hi"'  # a JSON escape for a lone surrogate
    cases = [
        ("/v1/completions", '{"prompt": %s, "max_tokens": 2}' % bad, "prompt"),
        ("/v1/completions", '{"prompt": %s, "max_tokens": 2, "stream": true}' % bad, "prompt"),
        ("/v1/completions", '{"prompt": ["ok", %s], "max_tokens": 2}' % bad, "prompt.1"),
        ("/v1/chat/completions",
         '{"messages": [{"role": "user", "content": %s}], "stream": true}' % bad,
         "messages.0.content"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": '
         '[{"type": "text", "text": %s}]}]}' % bad, "messages.0.content.0.text"),
        ("/tokenize", '{"prompt": %s}' % bad, "prompt"),
        ("/tokenize", '{"messages": [{"role": "user", "content": %s}]}' % bad,
         "messages.0.content"),
        ("/v1/completions", '{"prompt": "x", "stop": [%s]}' % bad, "stop.0"),
        ("/v1/completions", '{"model": %s, "prompt": "x"}' % bad, "model"),
    ]
    headers = {"Content-Type": "application/json"}

    async def requests(client):
        replies = [await client.post(route, content=body, headers=headers)
                   for route, body, _ in cases]
        # A valid surrogate pair is one character (U+1F600), not an error.
        pair = await client.post("/tokenize", content='{"prompt": "\\ud83d\\ude00"}',
                                 headers=headers)
        return replies, pair

    replies, pair = run_app(tokenizer, [], requests)
    for (route, body, param), r in zip(cases, replies):
        assert "not valid Unicode" in assert_error(r, 400, param)["message"], (route, body)
    assert pair.status_code == 200 and pair.json()["tokens"] == tokenizer(
        "\U0001F600", add_special_tokens=True).input_ids


def test_undecodable_and_deeply_nested_bodies_are_400(tokenizer):
    headers = {"Content-Type": "application/json"}
    bodies = [b'{"prompt": "caf\xe9"}',  # Latin-1, not UTF-8
              b"[" * 100_000 + b"]" * 100_000,  # deeper than the JSON parser recurses
              b'{"prompt": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"]

    async def requests(client):
        return [await client.post(route, content=body, headers=headers)
                for route in ("/v1/completions", "/tokenize") for body in bodies]

    replies = run_app(tokenizer, [], requests)
    for r in replies:
        assert_error(r, 400)
    # Each says what is wrong with the body (not only "error parsing the body").
    for i in (0, 3):
        assert "not valid UTF-8: byte 0xe9 at position 15" in replies[i].json()["error"]["message"]
    for i in (1, 2, 4, 5):
        assert "nested too deeply" in replies[i].json()["error"]["message"], replies[i].text


def test_invalid_json_names_the_position(tokenizer):
    async def requests(client):
        return await client.post("/v1/completions", content=b'{"prompt": "x",}',
                                 headers={"Content-Type": "application/json"})

    error = assert_error(run_app(tokenizer, [], requests), 400)
    assert error["message"].startswith("The request body is not valid JSON: "), error
    assert "char 15" in error["message"], error


@pytest.mark.parametrize("metadata,says", [
    ({f"k{i}": "v" for i in range(17)}, "too many properties"),
    ({"k" * 65: "v"}, "key with maximum length 64"),
    ({"k": "v" * 513}, "maximum length 512"),
    ({"k": {"nested": "v" * 50_000}}, "expected a string"),
    ({"k": 1}, "expected a string")])
def test_metadata_within_openai_limits(tokenizer, metadata, says):
    """`metadata` (chat completions and responses, as OpenAI): at most 16 pairs, keys of
    at most 64 characters, string values of at most 512; else a 400 naming it."""
    async def requests(client):
        chat = {"messages": MSGS, "max_tokens": 2}
        responses = {"input": "Hi", "max_output_tokens": 2}
        return ([await client.post("/v1/chat/completions", json={**chat, "metadata": metadata}),
                 await client.post("/v1/responses", json={**responses, "metadata": metadata})],
                [await client.post("/v1/chat/completions", json={**chat, "metadata": ok}),
                 await client.post("/v1/responses", json={**responses, "metadata": ok})])

    ok = {f"{'k' * 62}{i:02d}": "v" * 512 for i in range(16)}  # at every limit
    refused, accepted = run_app(tokenizer, [], requests)
    for r in refused:
        assert says in assert_error(r, 400, "metadata")["message"]
    for r in accepted:
        assert r.status_code == 200, r.text
    assert accepted[1].json()["metadata"] == ok


def test_request_chat_template_needs_trust_flag(tokenizer):
    async def requests(client):
        return [await client.post(route, json={"messages": MSGS, "chat_template": TEMPLATE,
                                                "max_tokens": 2})
                for route in ("/v1/chat/completions", "/tokenize")]

    for r in run_app(tokenizer, [], requests):
        error = assert_error(r, 400, "chat_template")
        assert "--trust-request-chat-template" in error["message"]
    chat, tok = run_app(tokenizer, ["--trust-request-chat-template"], requests)
    assert chat.status_code == 200, chat.text
    assert tok.json()["tokens"] == tokenizer("<user>Hi", add_special_tokens=False).input_ids


@pytest.mark.parametrize("value,status", [(0, 400), (-1, 200), (3, 200), (257, 400)])
def test_truncate_prompt_tokens_bounds(tokenizer, value, status):
    """0 would leave no prompt (vLLM then renders none): refused, as is more than
    max_model_len (256 for the fake engine); -1 and positive counts truncate."""
    body = {"prompt": "one two three four five six", "max_tokens": 2,
            "truncate_prompt_tokens": value}

    async def requests(client):
        return (await client.post("/v1/completions", json=body),
                await client.post("/v1/chat/completions",
                                  json={"messages": MSGS, **body, "prompt": None}))

    for r in run_app(tokenizer, [], requests):
        if status == 400:
            assert_error(r, 400, "truncate_prompt_tokens")
        else:
            assert r.status_code == 200, r.text
    if value == 3:
        completion = run_app(tokenizer, [], requests)[0].json()
        assert completion["usage"]["prompt_tokens"] == 3


def test_long_tokenization_does_not_hold_up_a_short_one(tokenizer):
    """The tokenizer pool: a prompt that takes seconds to encode leaves another thread (and
    the event loop) free, so a short prompt is encoded at once."""
    from vllm.entrypoints.openai.tokenizer_pool import TokenizerPool

    pool = TokenizerPool(tokenizer, workers=2)
    long_text = "hello world, this is a test. " * 40_000  # ~1.2M chars: seconds to encode

    async def main():
        await asyncio.gather(pool.encode("warm", True), pool.encode("up", True))  # copies
        long_job = asyncio.ensure_future(pool.encode(long_text, True))
        await asyncio.sleep(0.05)
        short = await pool.encode("Hello", True)
        long_still_running = not long_job.done()
        await long_job
        return short, long_still_running

    try:
        short, long_still_running = asyncio.run(main())
    finally:
        pool.shutdown()
    assert short == tokenizer("Hello").input_ids
    # The order of completion, not a time: the short prompt came back while the long
    # one was still being encoded on the other thread.
    assert long_still_running
