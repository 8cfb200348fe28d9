"""vLLM request fields: return_token_ids, prompt_tokens_details.cached_tokens
(--enable-prompt-tokens-details) and truncation_side work; every other vLLM field this
server does not implement is refused with a 400 naming it instead of being ignored."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer
from vllm.entrypoints.openai.protocol import NOT_IMPLEMENTED_FIELDS

CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def tiny_server(tiny_model_factory):
    model = tiny_model_factory("llama")
    srv = RemoteServer(["--model", model, "--served-model-name", "tiny", "--dtype", "float32",
                        "--max-model-len", "512", "--kv-cache-memory-bytes", str(16 << 20),
                        "--enable-prompt-tokens-details", "--enable-log-requests",
                        "--enable-log-outputs"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def tok():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))


def _events(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


@pytest.mark.parametrize("name", sorted(NOT_IMPLEMENTED_FIELDS))
def test_vllm_fields_not_implemented_are_refused(http, name):
    default = NOT_IMPLEMENTED_FIELDS[name][0]
    value = (not default) if isinstance(default, bool) else [{"a": "b"}]
    for path, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})):
        r = http.post(path, json={**body, name: value})
        assert r.status_code == 400, (path, name, r.text)
        err = r.json()["error"]
        assert err["param"] == name and name in err["message"]
        if default is not None:  # vLLM's default asks for nothing: accepted
            assert http.post(path, json={**body, name: default}).status_code == 200


def test_unknown_fields_are_still_ignored(http):
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "no_such": 1})
    assert r.status_code == 200


def test_return_token_ids(http, tok):
    prompt = "The capital of France is"
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = http.post("/v1/completions", json=body).json()["choices"][0]
    assert plain["token_ids"] is None and plain["prompt_token_ids"] is None
    full = http.post("/v1/completions", json={**body, "return_token_ids": True}).json()
    choice = full["choices"][0]
    assert choice["prompt_token_ids"] == tok(prompt).input_ids
    assert len(choice["token_ids"]) == 6
    assert tok.decode(choice["token_ids"]) == choice["text"]
    chunks = [e["choices"][0] for e in _events(http, "/v1/completions",
                                               {**body, "return_token_ids": True})]
    assert chunks[0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all(c["prompt_token_ids"] is None for c in chunks[1:])
    assert sum((c["token_ids"] for c in chunks), []) == choice["token_ids"]

    chat = {"messages": CHAT, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    full = http.post("/v1/chat/completions", json=chat).json()
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert full["prompt_token_ids"] == tok(rendered, add_special_tokens=False).input_ids
    ids = full["choices"][0]["token_ids"]
    assert len(ids) == 5 and tok.decode(ids) == full["choices"][0]["message"]["content"]
    events = _events(http, "/v1/chat/completions", chat)
    assert events[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert all(e.get("prompt_token_ids") is None for e in events[1:])
    assert sum((e["choices"][0]["token_ids"] or [] for e in events), []) == ids


def test_cached_tokens(http):
    prompt = "Cached tokens test. " + "Some words to fill several blocks. " * 12
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = http.post("/v1/completions", json=body).json()["usage"]
    second = http.post("/v1/completions", json=body).json()["usage"]
    n = first["prompt_tokens"]
    assert n > 64
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    # Every full block but the one holding the last prompt token comes from the cache.
    assert second["prompt_tokens_details"] == {"cached_tokens": (n - 1) // 16 * 16}
    events = _events(http, "/v1/completions",
                     {**body, "stream_options": {"include_usage": True}})
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
    chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    http.post("/v1/chat/completions", json=chat)
    usage = http.post("/v1/chat/completions", json=chat).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == \
        (usage["prompt_tokens"] - 1) // 16 * 16


def test_truncation_side(http, tok):
    ids = list(range(1000, 1010))
    for side, kept in ((None, ids[-3:]), ("left", ids[-3:]), ("right", ids[:3])):
        body = {"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 3,
                "return_token_ids": True}
        if side is not None:
            body["truncation_side"] = side
        out = http.post("/v1/completions", json=body).json()
        assert out["choices"][0]["prompt_token_ids"] == kept, side
        assert out["usage"]["prompt_tokens"] == 3
    text = "one two three four five six seven eight nine ten"
    full = tok(text).input_ids
    out = http.post("/v1/completions", json={
        "prompt": text, "max_tokens": 1, "truncate_prompt_tokens": 4,
        "truncation_side": "right", "return_token_ids": True}).json()
    assert out["choices"][0]["prompt_token_ids"] == full[:4]
    out = http.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 1, "truncate_prompt_tokens": 4,
        "truncation_side": "right", "return_token_ids": True}).json()
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert out["prompt_token_ids"] == tok(rendered, add_special_tokens=False).input_ids[:4]
    bad = http.post("/v1/completions", json={"prompt": "x", "truncation_side": "middle"})
    assert bad.status_code == 400


def test_stream_interval_batches_chunks(http):
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.0,
            "ignore_eos": True}
    plain = _events(http, "/v1/completions", body)
    batched = _events(http, "/v1/completions", {**body, "stream_interval": 5})
    text = lambda evs: "".join(c["text"] for e in evs for c in e["choices"])  # noqa: E731
    assert text(batched) == text(plain)
    assert len(batched) < len(plain)
    # First chunk at once (1 token), then chunks of at least 5 new tokens, the last early.
    sizes = [len(e["choices"][0]["text"]) for e in batched if e["choices"]]
    assert len(sizes) <= 1 + -(-11 // 5)
    chat = _events(http, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 12,
                                                  "temperature": 0.0, "ignore_eos": True,
                                                  "stream_interval": 4})
    assert chat[-1]["choices"][0]["finish_reason"] == "length"
    r = http.post("/v1/completions", json={**body, "stream_interval": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_interval"


def test_return_prompt_text(http, tok):
    body = {"messages": CHAT, "max_tokens": 2, "return_prompt_text": True}
    full = http.post("/v1/chat/completions", json=body).json()
    assert full["prompt_text"].endswith("Say something.<|im_end|>\n<|im_start|>assistant\n")
    events = _events(http, "/v1/chat/completions", body)
    assert events[0]["prompt_text"] == full["prompt_text"]
    assert all(e.get("prompt_text") is None for e in events[1:])
    plain = http.post("/v1/chat/completions", json={**body, "return_prompt_text": False})
    assert plain.json()["prompt_text"] is None


def test_echo_with_max_tokens_zero_returns_the_prompt_scored(http):
    """lm-eval's log-likelihood call: the prompt, its logprobs, nothing generated."""
    body = {"prompt": "The cat sat on the mat", "max_tokens": 0, "echo": True,
            "logprobs": 1, "temperature": 0}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["text"] == "The cat sat on the mat"
    assert choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) >= 5
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == "The cat sat on the mat"
    # vLLM counts the one token its engine computed (and leaves out of the text).
    assert out["usage"]["completion_tokens"] == 1
    # echo + logprobs fill vLLM's prompt_logprobs extension: one entry per prompt
    # token, the first None.
    prompt_lp = choice["prompt_logprobs"]
    assert prompt_lp[0] is None and len(prompt_lp) == len(lp["tokens"])
    assert all(isinstance(step, dict) and step for step in prompt_lp[1:])
    events = _events(http, "/v1/completions", {**body, "stream_options": {
        "include_usage": True}})
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == "The cat sat on the mat"
    assert events[-1]["usage"]["completion_tokens"] == 1
    # Without echo, max_tokens 0 stays an error.
    r = http.post("/v1/completions", json={**body, "echo": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_prompt_logprobs_cannot_stream(http):
    for path, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})):
        r = http.post(path, json={**body, "prompt_logprobs": 1, "stream": True})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "prompt_logprobs"


def test_continuous_usage_counts_each_choice(http):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": CHAT})):
        events = _events(http, path, {**body, "max_tokens": 3, "n": 2, "temperature": 1.0,
                                      "seed": 1, "ignore_eos": True, "stream_options": opts})
        per_choice: dict[int, list[int]] = {}
        for e in events:
            for c in e["choices"]:
                per_choice.setdefault(c["index"], []).append(e["usage"]["completion_tokens"])
        assert sorted(per_choice) == [0, 1]
        for counts in per_choice.values():
            assert counts == sorted(counts) and max(counts) == 3, (path, per_choice)
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


def test_null_max_tokens_on_completions_is_the_default(http):
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": None,
                                           "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16


def test_request_ids_from_body_and_header(http):
    import concurrent.futures
    body = {"prompt": "Hi", "max_tokens": 4, "request_id": "dup"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda _: http.post("/v1/completions", json=body), range(3)))
    assert [r.status_code for r in responses] == [200] * 3
    assert {r.json()["id"] for r in responses} == {"cmpl-dup"}
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2},
                  headers={"X-Request-Id": "hdr123"})
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-hdr123"


def test_truncate_minus_one_leaves_room_for_the_output(http):
    ids = [100 + (i % 50) for i in range(600)]  # longer than max_model_len (512)
    r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 4,
                                           "truncate_prompt_tokens": -1, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 508


def test_continue_final_message_after_a_user_turn(http):
    """vLLM refuses it only with add_generation_prompt; any final role is continued."""
    r = http.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 2, "continue_final_message": True,
        "add_generation_prompt": False, "return_prompt_text": True})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_text"].endswith("Say something.")  # left open, no end marker


def test_bad_words(http, tok):
    body = {"prompt": "the cat sat on", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    base = http.post("/v1/completions", json=body).json()["choices"][0]
    word = base["text"].split()[0] if base["text"].split() else None
    assert word, base
    out = http.post("/v1/completions", json={**body, "bad_words": [word]})
    assert out.status_code == 200, out.text
    ids = out.json()["choices"][0]["token_ids"]
    assert ids != base["token_ids"]
    for text in (word, " " + word):  # the spellings bad_words forbids
        seq = tok.encode(text, add_special_tokens=False)
        assert not any(ids[j:j + len(seq)] == seq for j in range(len(ids))), (text, ids)
    bad = http.post("/v1/completions", json={**body, "bad_words": "oops"})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("bad_words")


def test_cache_salt(http):
    prompt = [300 + i for i in range(64)]

    def cached(**extra) -> int:
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached(cache_salt="a")
    assert cached(cache_salt="a") > 0
    assert cached(cache_salt="b") == 0
    assert cached() == 0  # unsalted requests do not see salted blocks
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "cache_salt": ""})
    assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"]


def test_log_outputs(http, tiny_server):
    body = {"prompt": "Log me", "max_tokens": 3, "ignore_eos": True, "temperature": 0,
            "request_id": "logged"}
    full = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    events = _events(http, "/v1/completions", {**body, "request_id": "logged-stream"})
    streamed = "".join(c["text"] for e in events for c in e["choices"])
    log = tiny_server.tail(20000)
    for rid, text in (("cmpl-logged-", full), ("cmpl-logged-stream-", streamed)):
        lines = [ln for ln in log.splitlines() if "Generated response " + rid in ln]
        assert lines and f"output: {text!r}" in lines[-1], (rid, lines)
        assert "finish_reason: length" in lines[-1]


def _cli(args: list[str], stdin: str = "") -> "subprocess.CompletedProcess":
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", *args],
                          input=stdin, capture_output=True, text=True, timeout=120)


def test_vllm_complete_and_chat_commands(tiny_server):
    url = tiny_server.url + "/v1"
    done = _cli(["complete", "--url", url, "--max-tokens", "3", "-q", "Hello"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    # A conversation piped in: one answer per line, the model taken from /v1/models.
    chat = _cli(["chat", "--url", url, "--system-prompt", "Be brief.", "--max-tokens", "4"],
                stdin="Hi\nAnd again\n")
    assert chat.returncode == 0, chat.stderr
    assert len(chat.stdout.splitlines()) >= 2
    gone = _cli(["chat", "--url", "http://127.0.0.1:9/v1", "-q", "hi"])
    assert gone.returncode == 1 and "APIConnectionError" in gone.stdout + gone.stderr


def test_system_fingerprint_as_vllm(http):
    """vLLM's default (--fingerprint-mode full) fingerprint on full responses and on a
    stream's last chunk: the usage chunk, else the chunk that finishes the choice."""
    import re

    from vllm.version import __version__
    pattern = rf"vllm-{re.escape(__version__)}-[0-9a-f]{{8}}"
    for path, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})):
        full = http.post(path, json=body).json()
        assert re.fullmatch(pattern, full["system_fingerprint"]), full
        events = _events(http, path, {**body, "stream_options": {"include_usage": True}})
        assert events[-1]["usage"] and events[-1]["system_fingerprint"] == \
            full["system_fingerprint"]
        assert all(e["system_fingerprint"] is None for e in events[:-1])
        events = _events(http, path, body)
        stamped = [e for e in events if e["system_fingerprint"]]
        assert stamped and all(c["finish_reason"] for e in stamped for c in e["choices"])
