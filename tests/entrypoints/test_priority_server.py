"""`--scheduling-policy priority` served: with one sequence slot, a high-priority request
sent while a long low-priority one streams preempts it, finishes first, and the low one
still completes with the output it has alone (greedy, recomputed after preemption)."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--dtype", "float32",
                        "--max-model-len", "512", "--max-num-seqs", "1",
                        "--scheduling-policy", "priority", "--disable-log-requests"])
    yield srv
    srv.stop()


def _body(prompt: str, max_tokens: int, priority: int, stream: bool = False) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "priority": priority, "stream": stream}


def test_high_priority_request_overtakes_a_running_low_one(server):
    url = server.url + "/v1/completions"
    low_alone = httpx.post(url, json=_body("the cat sat on", 300, 5), timeout=120)
    high_alone = httpx.post(url, json=_body("one two three", 4, 0), timeout=60)
    assert low_alone.status_code == 200 and high_alone.status_code == 200
    events: list[str] = []
    low_text: list[str] = []
    started = threading.Event()

    def stream_low() -> None:
        with httpx.stream("POST", url, json=_body("the cat sat on", 300, 5, stream=True),
                          timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                started.set()
                low_text.append(json.loads(line[6:])["choices"][0]["text"])
        events.append("low")

    thread = threading.Thread(target=stream_low)
    thread.start()
    assert started.wait(60)
    high = httpx.post(url, json=_body("one two three", 4, 0), timeout=60)
    events.append("high")
    thread.join(120)
    assert high.status_code == 200, high.text
    assert events == ["high", "low"]
    assert high.json()["choices"][0]["text"] == high_alone.json()["choices"][0]["text"]
    assert "".join(low_text) == low_alone.json()["choices"][0]["text"]
    metrics = httpx.get(server.url + "/metrics").text
    preemptions = [float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("vllm:num_preemptions_total")]
    assert preemptions and preemptions[0] >= 1


def test_priority_on_chat_and_bad_values(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": -3},
        timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/completions", json=_body("x", 2, "high"), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
