"""Malformed requests get a 4xx OpenAI error body, and the server keeps serving."""
from __future__ import annotations

import pytest

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "Hi"}]

# (route, body, expected status, expected error param or None to skip the check)
CASES = [
    # wrong types
    (COMPLETIONS, {"prompt": 123}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "x", "stop": 5}, 400, "stop"),
    (COMPLETIONS, {"prompt": [[1, 2], "mixed"]}, 400, "prompt"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": [{"content": "no role"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": MSGS, "logprobs": "yes please"}, 400, "logprobs"),
    (CHAT, {"messages": MSGS, "stream": {"a": 1}}, 400, "stream"),
    # missing fields
    (COMPLETIONS, {}, 400, "prompt"),
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, None),
    # negative values
    (COMPLETIONS, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "temperature": -1}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "x", "n": 0}, 400, "n"),
    (COMPLETIONS, {"prompt": "x", "top_p": -0.5}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "x", "top_k": -5}, 400, "top_k"),
    (COMPLETIONS, {"prompt": "x", "min_p": -1}, 400, "min_p"),
    (COMPLETIONS, {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": -5}, 400, "presence_penalty"),
    (COMPLETIONS, {"prompt": "x", "repetition_penalty": -1}, 400, "repetition_penalty"),
    (COMPLETIONS, {"prompt": "x", "min_tokens": -1}, 400, "min_tokens"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [-1]}, 400, None),
    (COMPLETIONS, {"prompt": [-3, 5]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"-1": 1}}, 400, None),
    (COMPLETIONS, {"prompt": "x", "truncate_prompt_tokens": -5}, 400,
     "truncate_prompt_tokens"),
    (CHAT, {"messages": MSGS, "top_logprobs": -1, "logprobs": True}, 400, "top_logprobs"),
    (CHAT, {"messages": MSGS, "max_completion_tokens": -3}, 400, "max_completion_tokens"),
    # huge values
    (COMPLETIONS, {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "n": 10**6}, 400, "n"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 10**6}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "x", "seed": 2**64}, 400, "seed"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 10**6}, 400, "prompt_logprobs"),
    (COMPLETIONS, {"prompt": "x", "allowed_token_ids": [10**9]}, 400, None),
    (CHAT, {"messages": MSGS, "top_logprobs": 10**6, "logprobs": True}, 400, "top_logprobs"),
    (CHAT, {"messages": MSGS, "n": 10**9, "temperature": 1}, 400, "n"),
    # unknown model, refused features, template misuse
    (COMPLETIONS, {"model": "nope", "prompt": "x"}, 404, "model"),
    (CHAT, {"model": "nope", "messages": MSGS}, 404, "model"),
    (CHAT, {"messages": MSGS, "continue_final_message": True}, 400, "continue_final_message"),
    (CHAT, {"messages": MSGS, "chat_template_kwargs": {"tokenize": True}}, 400,
     "chat_template_kwargs"),
    (CHAT, {"messages": MSGS, "chat_template": "{% for %}"}, 400, None),
    (CHAT, {"messages": MSGS, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": MSGS, "priority": 3}, 400, "priority"),
    (COMPLETIONS, {"prompt": "x", "stream": True, "max_tokens": -1}, 400, "max_tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/tokenize", {"nothing": 1}, 400, None),
]


@pytest.mark.parametrize("route,body,status,param", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_malformed_request(http, route, body, status, param):
    r = http.post(route, json=body)
    assert r.status_code == status, (body, r.text)
    error = r.json()["error"]
    assert error["code"] == status and error["message"] and error["type"]
    if param is not None:
        # A union field reports the failing member's path (e.g. "prompt.0").
        assert error["param"] == param or error["param"].startswith(param + "."), (body, error)
    if status == 404:
        assert error["message"] == f"The model `{body['model']}` does not exist."


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'"text"',
                                 b'{"prompt": "x", "temperature": NaN}',
                                 b'{"prompt": "x", "max_tokens": Infinity}'])
def test_invalid_json(http, raw):
    r = http.post(COMPLETIONS, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400


def test_huge_prompt_and_server_survives(http):
    big = "hello " * ((1 << 20) // 6 + 1)  # about 1 MB of text
    for route, body in ((COMPLETIONS, {"prompt": big, "max_tokens": 1}),
                        (CHAT, {"messages": [{"role": "user", "content": big}]})):
        r = http.post(route, json=body)
        assert r.status_code == 400, r.text[:300]
        message = r.json()["error"]["message"]
        assert "maximum context length is 8192 tokens" in message
    too_long = http.post(COMPLETIONS, json={"prompt": "hi " * 8000, "max_tokens": 500})
    assert too_long.status_code == 400
    assert "However, you requested" in too_long.json()["error"]["message"]
    # Accepted-but-extreme values must not crash the engine.
    for extra in ({"top_k": 10**9}, {"temperature": 1e300}, {"presence_penalty": 1e30},
                  {"logit_bias": {"5": 1e9}}, {"stop": ["a"] * 50}, {"unknown_field": 1}):
        r = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2, **extra})
        assert r.status_code in (200, 400), (extra, r.text)
    assert http.get("/health").status_code == 200
    ok = http.post(COMPLETIONS, json={"prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_unknown_route_and_method(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = http.get(COMPLETIONS)
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
