"""thinking_token_budget against a served tiny model with --reasoning-parser deepseek_r1:
the reasoning is cut at the budget by the forced `</think>`, the answer follows."""
from __future__ import annotations

import signal

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer

CHAT = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def served(tiny_model_factory):
    path = tiny_model_factory("qwen2")
    srv = RemoteServer(["--model", path, "--dtype", "float32", "--max-model-len", "256",
                        "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(16 << 20),
                        "--disable-log-requests", "--reasoning-parser", "deepseek_r1"])
    yield srv, path
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_cut_at_the_budget(served, stream):
    from transformers import AutoTokenizer
    srv, path = served
    tok = AutoTokenizer.from_pretrained(path)
    end = tok.encode("</think>", add_special_tokens=False)
    budget = 6
    body = {"messages": CHAT, "max_tokens": 20, "temperature": 0, "ignore_eos": True,
            "thinking_token_budget": budget, "return_token_ids": True}
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        full = http.post("/v1/chat/completions", json=body)
        assert full.status_code == 200, full.text
        choice = full.json()["choices"][0]
        ids = choice["token_ids"]
        assert ids[budget:budget + len(end)] == end
        reasoning, content = choice["message"]["reasoning"], choice["message"]["content"]
        if stream:
            import json
            reasoning, content = "", ""
            with http.stream("POST", "/v1/chat/completions",
                             json={**body, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for c in json.loads(line[6:])["choices"]:
                            reasoning += c["delta"].get("reasoning") or ""
                            content += c["delta"].get("content") or ""
    assert reasoning == tok.decode(ids[:budget])
    assert len(tok.encode(reasoning, add_special_tokens=False)) <= budget
    assert content and content == tok.decode(ids[budget + len(end):])


def test_budget_refused_on_completions(served):
    srv, _ = served
    r = httpx.post(srv.url + "/v1/completions", timeout=60,
                   json={"prompt": "x", "max_tokens": 2, "thinking_token_budget": 3})
    assert r.status_code == 400 and "thinking_token_budget" in r.text
