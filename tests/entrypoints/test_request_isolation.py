"""No request can stall the others: a pathological (trusted) request template, a 20 MiB
body and an over-long prompt each leave a concurrent small request within 1 s of its usual
latency, and a template whose client left stops rendering (real server, tiny model)."""
from __future__ import annotations

import signal
import statistics
import threading
import time

import httpx
import psutil
import pytest

from tests.entrypoints.conftest import RemoteServer

MAX_MODEL_LEN = 256
TEMPLATE_TIMEOUT_S = 4.0
# 10^9 iterations: jinja2's sandbox caps each range() at 10^5, not their product.
SLOW_TEMPLATE = ("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                 "{% endfor %}{% endfor %}{% endfor %}{{ messages[0].content }}")
MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--dtype", "float32",
                        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
                        "--kv-cache-memory-bytes", str(16 << 20), "--disable-log-requests",
                        "--trust-request-chat-template"],
                       env={"VLLM_CHAT_TEMPLATE_TIMEOUT_S": str(TEMPLATE_TIMEOUT_S)})
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def small_request_latency(url: str) -> float:
    start = time.monotonic()
    r = httpx.post(url + "/v1/completions", timeout=30,
                   json={"prompt": "Hello there", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def latencies_during(url: str, hostile, min_s: float) -> tuple[list[float], object]:
    """Latencies of small requests sent one after another while `hostile()` runs."""
    result: dict = {}

    def run() -> None:
        result["value"] = hostile()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.2)  # let the hostile request reach the server first
    latencies = []
    start = time.monotonic()
    while thread.is_alive() or time.monotonic() - start < min_s:
        latencies.append(small_request_latency(url))
        if len(latencies) > 200:
            break
    thread.join(60)
    return latencies, result.get("value")


@pytest.fixture(scope="module")
def baseline(server) -> float:
    small_request_latency(server.url)  # warm
    return statistics.median(small_request_latency(server.url) for _ in range(5))


def test_slow_request_template_is_bounded_and_isolated(server, baseline):
    def hostile():
        start = time.monotonic()
        r = httpx.post(server.url + "/tokenize", timeout=60,
                       json={"messages": MSGS, "chat_template": SLOW_TEMPLATE})
        return r, time.monotonic() - start

    latencies, (reply, took) = latencies_during(server.url, hostile, min_s=1.0)
    print(f"\n[template] small request: {baseline:.3f} s alone, at most {max(latencies):.3f} s "
          f"during a runaway template ({len(latencies)} requests; it ended after {took:.1f} s)")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "chat_template" and "did not finish rendering" in error["message"]
    assert took < TEMPLATE_TIMEOUT_S + 15  # the deadline, plus the helper's first start
    assert max(latencies) < baseline + 1.0, (baseline, latencies)
    # The helper is usable again afterwards, and a fast request template renders.
    ok = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": MSGS, "max_tokens": 2, "chat_template": SLOW_TEMPLATE.replace("1000", "2")})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["prompt_tokens"] >= 1


def _template_helpers(server) -> list[psutil.Process]:
    helpers = []
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "template_sandbox" in " ".join(child.cmdline()):
                helpers.append(child)
        except psutil.NoSuchProcess:
            pass
    return helpers


def test_template_render_stops_when_client_leaves(server):
    ready = httpx.post(server.url + "/tokenize", timeout=60,  # a helper is up
                       json={"messages": MSGS, "chat_template": "{{ messages[0].content }}"})
    assert ready.status_code == 200
    helpers = _template_helpers(server)  # the one that rendered, and a loaded spare
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/chat/completions", timeout=0.5,
                   json={"messages": MSGS, "chat_template": SLOW_TEMPLATE})
    # The helper rendering it is killed once its client left, long before the deadline
    # (a fresh spare replaces it; idle helpers are never killed).
    gone, _ = psutil.wait_procs(helpers, timeout=TEMPLATE_TIMEOUT_S - 1.5)
    assert len(gone) == 1, "the template kept rendering after its client left"


# Builds a string of 2^33 characters: past the helper's address-space limit.
MEMORY_BOMB = ("{% set s = namespace(v='x') %}{% for i in range(33) %}"
               "{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v | length }}")


def test_concurrent_runaway_templates_each_keep_their_deadline(server):
    """Two runaway templates and a memory bomb at once each end within their own
    deadline, in their own helper (served one after another they took 3 deadlines)."""
    quick = {"messages": MSGS, "chat_template": "{{ messages[0].content }}"}
    warm = [threading.Thread(target=httpx.post, args=(server.url + "/tokenize",),
                             kwargs={"json": quick, "timeout": 60}) for _ in range(3)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    results: dict[int, tuple] = {}

    def send(i: int, template: str) -> None:
        start = time.monotonic()
        r = httpx.post(server.url + "/tokenize", timeout=60,
                       json={"messages": MSGS, "chat_template": template})
        results[i] = (r, time.monotonic() - start)

    threads = [threading.Thread(target=send, args=(i, t))
               for i, t in enumerate([SLOW_TEMPLATE, SLOW_TEMPLATE, MEMORY_BOMB])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(3):
        reply, took = results[i]
        # The bomb's MemoryError may surface while rendering (param chat_template) or
        # in the template helper's message handling (param messages): a 400 either way.
        error = assert_error_400(reply, ("chat_template",) if i < 2 else
                                 ("chat_template", "messages"))
        print(f"\n[template {i}] 400 after {took:.1f} s: {error['message'][:80]}")
        # Serially the last would end after 3 deadlines; each has its own here.
        assert took < 2 * TEMPLATE_TIMEOUT_S, (i, took)
    assert "did not finish rendering" in results[0][0].json()["error"]["message"]
    # The bomb ends at its memory limit or its deadline, whichever comes first.
    bomb = results[2][0].json()["error"]["message"]
    assert "MemoryError" in bomb or "did not finish rendering" in bomb, bomb


def assert_error_400(reply: httpx.Response, params: tuple[str, ...]) -> dict:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] in params, error
    return error


def test_huge_body_and_prompt_are_refused_early(server, baseline):
    huge = "x" * (20 << 20)

    def hostile():
        start = time.monotonic()
        r = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"prompt": huge, "max_tokens": 1})
        return r, time.monotonic() - start

    latencies, (reply, took) = latencies_during(server.url, hostile, min_s=1.0)
    print(f"\n[20 MiB] small request: {baseline:.3f} s alone, at most {max(latencies):.3f} s "
          f"during a 20 MiB body ({len(latencies)} requests; 413 after {took:.2f} s)")
    assert reply.status_code == 413, reply.text[:300]
    assert reply.json()["error"]["code"] == 413 and took < 5
    assert max(latencies) < baseline + 1.0, (baseline, latencies)
    # Under the body bound but beyond what max_model_len tokens can spell: 400 before
    # tokenizing, on every route that tokenizes text.
    long_text = "hello " * 40_000
    for route, body in (("/v1/completions", {"prompt": long_text, "max_tokens": 1}),
                        ("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": long_text}]}),
                        ("/tokenize", {"prompt": long_text})):
        r = httpx.post(server.url + route, json=body, timeout=30)
        assert r.status_code == 400, r.text[:300]
        assert f"maximum context length is {MAX_MODEL_LEN} tokens" in r.json()["error"]["message"]
    # With truncation only the tail is tokenized; the kept tokens are the text's last ones.
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "prompt": long_text + "the end", "max_tokens": 1, "truncate_prompt_tokens": 5,
        "echo": True})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["prompt_tokens"] == 5
    assert r.json()["choices"][0]["text"].startswith(" hello hello hello the end")
    # A chunked body (no Content-Length) is bounded the same way.
    chunked = httpx.post(server.url + "/v1/completions", timeout=60,
                         content=iter([b'{"prompt": "', b"x" * (20 << 20), b'"}']),
                         headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
