"""One hostile request must not take the server down (real server, tiny model with the
default model's 49k-token vocabulary, so grammars cost what they cost in production).

- The 20,000-property tool schema that once grew the engine core to 11 GB is a 400 at
  once, and the core's memory stays put.
- A grammar whose compile passes the time limit is a 400 naming the limit, streamed or
  not; the engine keeps serving.
- While such a compile runs, plain and json_object requests keep their latency.
- A compile whose client left stops (no process of the server keeps burning CPU).
- The whole battery of tests/entrypoints/hostile_battery.py: no 5xx, no answer slower
  than 30 s, the server alive after.
"""
from __future__ import annotations

import asyncio
import signal
import statistics
import threading
import time

import httpx
import psutil
import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.entrypoints.hostile_battery import pattern_properties, run_battery, tool

COMPILE_TIMEOUT_S = 4.0
MSGS = [{"role": "user", "content": "Hi"}]
HEAVY = pattern_properties(1000)
"""Within every size limit; even parsing it takes minutes (1,000 patterns whose
repetition bounds expand into grammar rules), so it always meets the time limit."""


def slow_compile(n: int) -> dict:
    """Parsed at once, compiled in seconds: n short patterns, each a regex to match
    against the 49k-token vocabulary (a few milliseconds each)."""
    return {"type": "object", "properties": {
        f"f{i}": {"type": "string", "pattern": "^[a-z]+[0-9]*$"} for i in range(n)}}


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--dtype", "float32",
                        "--max-model-len", "256", "--max-num-seqs", "8",
                        "--kv-cache-memory-bytes", str(16 << 20), "--disable-log-requests"],
                       env={"VLLM_STRUCTURED_OUTPUT_COMPILE_TIMEOUT_S": str(COMPILE_TIMEOUT_S),
                            "VLLM_ENABLE_RESPONSES_API_STORE": "1"})
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def core_process(server: RemoteServer) -> psutil.Process:
    """The engine core: the server's child with the largest memory."""
    procs = [psutil.Process(pid) for pid in server.children()]
    return max(procs, key=lambda p: p.memory_info().rss)


def chat(url: str, timeout: float = 60, **fields) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=timeout,
                      json={"messages": MSGS, "max_tokens": 4, "temperature": 0, **fields})


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_twenty_thousand_property_tool_schema_is_a_prompt_400(server):
    core = core_process(server)
    rss_before = core.memory_info().rss
    start = time.monotonic()
    r = chat(server.url, tools=tool(pattern_properties(20_000)), tool_choice="required")
    took = time.monotonic() - start
    assert r.status_code == 400, r.text
    assert "VLLM_STRUCTURED_OUTPUT_MAX" in r.json()["error"]["message"]
    assert took < 10, took
    assert core.memory_info().rss - rss_before < 64 << 20  # the core never saw it
    assert chat(server.url).status_code == 200


def test_compile_past_the_time_limit_is_a_400_and_the_engine_serves_on(server):
    start = time.monotonic()
    r = chat(server.url, response_format=schema_format(HEAVY))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "VLLM_STRUCTURED_OUTPUT_COMPILE_TIMEOUT_S" in error["message"]
    assert error["code"] == 400 and error["type"]
    assert time.monotonic() - start < COMPILE_TIMEOUT_S + 30
    # Streamed: the failure is the stream's error event. The failed compile is cached,
    # so this answer comes at once.
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "messages": MSGS, "max_tokens": 4, "stream": True,
            "response_format": schema_format(HEAVY)}) as s:
        text = "".join(s.iter_text())
    assert "COMPILE_TIMEOUT_S" in text and '"code":400' in text.replace(" ", "")
    assert chat(server.url).status_code == 200


def _latency(fn) -> float:
    start = time.monotonic()
    r = fn()
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def test_a_compile_in_flight_does_not_delay_plain_or_json_object_requests(server):
    plain = lambda: chat(server.url)  # noqa: E731
    json_object = lambda: chat(server.url, response_format={"type": "json_object"})  # noqa
    json_object()  # its (direct, helper-free) compile is cached from here on
    base = [statistics.median(_latency(f) for _ in range(3)) for f in (plain, json_object)]
    schema = slow_compile(1000)
    hostile = threading.Thread(target=chat, args=(server.url,),
                               kwargs={"response_format": schema_format(schema)})
    hostile.start()
    time.sleep(1.5)  # the engine's helper has started and compiles
    during = [statistics.median(_latency(f) for _ in range(3)) for f in (plain, json_object)]
    hostile.join(60)
    for b, d in zip(base, during):
        assert d < b + 0.5, (base, during)


def test_a_compile_whose_client_left_stops(server):
    schema = slow_compile(999)  # not the spec of the test above (cached)
    try:
        chat(server.url, timeout=2.0, response_format=schema_format(schema))
    except httpx.TimeoutException:
        pass
    time.sleep(1.0)
    procs = [psutil.Process(pid) for pid in server.children()]
    procs.append(psutil.Process(server.proc.pid))
    for p in procs:
        p.cpu_percent(None)
    time.sleep(2.0)
    busy = {p.pid: p.cpu_percent(None) for p in procs if p.is_running()}
    assert sum(busy.values()) < 40, busy  # idle; a compile would burn a whole core


def test_the_hostile_battery(server):
    results, dead = asyncio.run(run_battery(server.url, max_seconds=30.0))
    bad = [(r.name, r.statuses, r.problem) for r in results if not r.ok]
    assert not bad, bad
    assert dead is None, dead
    by_name = {r.name: r for r in results}
    assert by_name["20k-property tool schema"].statuses == [400]
    assert by_name["100k-entry enum"].statuses == [400]
    assert by_name["10k prompts"].statuses == [400]
    assert by_name["unknown call_id"].statuses == [400]
