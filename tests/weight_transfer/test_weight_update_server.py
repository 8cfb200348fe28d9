"""The RL routes of a real server (engine core in its own process, the default):
pause, in-place update to another checkpoint, resume; outputs equal a fresh engine."""
from __future__ import annotations

import gc
import json
import signal
import threading
import time

import httpx
import pytest
from tests.entrypoints.conftest import RemoteServer

from _wt_helpers import MAX_TOKENS, PROMPTS


@pytest.fixture(scope="module")
def rl_server(ckpt_a):
    srv = RemoteServer([
        "--model", ckpt_a, "--dtype", "float32", "--max-model-len", "1024",
        "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(32 << 20),
        "--enable-prefix-caching", "--weight-transfer-config", '{"backend": "disk"}',
        "--disable-log-requests"], env={"VLLM_SERVER_DEV_MODE": "1"})
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


@pytest.fixture(scope="module")
def http(rl_server):
    with httpx.Client(base_url=rl_server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def fresh_b_texts(ckpt_b) -> list[str]:
    from vllm import LLM, SamplingParams
    llm = LLM(ckpt_b, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        return [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.llm_engine.shutdown()
        del llm
        gc.collect()


def _complete(http, prompt: str, max_tokens: int = MAX_TOKENS) -> dict:
    r = http.post("/v1/completions", json={
        "model": http.get("/v1/models").json()["data"][0]["id"], "prompt": prompt,
        "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _texts(http) -> list[str]:
    return [_complete(http, p)["text"] for p in PROMPTS]


@pytest.mark.timeout(240)
def test_pause_update_resume_over_http(http, ckpt_b, fresh_b_texts):
    before = _texts(http)
    assert before != fresh_b_texts
    # Refused calls: 400 with an OpenAI-style error, nothing changed.
    r = http.post("/update_weights", json={"update_info": {"path": ckpt_b}})
    assert r.status_code == 400
    assert "init_weight_transfer_engine first" in r.json()["error"]["message"]
    r = http.post("/init_weight_transfer_engine", json={})
    assert r.status_code == 400 and "init_info" in r.json()["error"]["message"]
    r = http.post("/pause", params={"mode": "later"})
    assert r.status_code == 400 and "pause mode" in r.json()["error"]["message"]
    assert http.get("/weight_info").json() == {"weight_version": None}
    assert http.get("/get_world_size").json() == {"world_size": 1}

    # A long request in flight is aborted by the pause (mode abort, the default).
    model = http.get("/v1/models").json()["data"][0]["id"]
    finish = []
    with http.stream("POST", "/v1/completions", json={
            "model": model, "prompt": PROMPTS[0], "max_tokens": 900, "temperature": 0.0,
            "ignore_eos": True, "stream": True}) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")  # generating
        assert http.post("/pause").json() == {"status": "paused"}
        for line in lines:
            if line.startswith("data: {"):
                finish.append(json.loads(line[6:])["choices"][0]["finish_reason"])
    assert finish[-1] == "abort"
    assert http.get("/is_paused").json() == {"is_paused": True}

    # A request sent while paused waits for /resume, then runs on the new weights.
    waiting: list = []
    waiter = threading.Thread(target=lambda: waiting.append(_complete(http, PROMPTS[1])))
    waiter.start()
    assert http.post("/init_weight_transfer_engine", json={"init_info": {}}).status_code == 200
    assert http.post("/start_weight_update").status_code == 200
    r = http.post("/update_weights", json={"update_info": {"path": ckpt_b}})
    assert r.status_code == 200, r.text
    r = http.post("/finish_weight_update", json={"weight_version": "policy-1"})
    assert r.status_code == 200, r.text
    time.sleep(0.5)
    assert waiter.is_alive() and not waiting
    assert http.post("/resume").json() == {"status": "resumed"}
    waiter.join(60)
    assert waiting[0]["text"] == fresh_b_texts[1]
    assert http.get("/is_paused").json() == {"is_paused": False}
    assert http.get("/weight_info").json() == {"weight_version": "policy-1"}
    assert _texts(http) == fresh_b_texts
    r = http.post("/update_weight_version", json={"new_version": "policy-1b"})
    assert r.json() == {"success": True, "new_version": "policy-1b"}
    assert http.get("/weight_info").json() == {"weight_version": "policy-1b"}


def _generated_tokens(http) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            return float(line.split()[-1])
    raise AssertionError("no vllm:generation_tokens_total in /metrics")


@pytest.mark.timeout(120)
def test_pause_keep_freezes_and_wait_drains(http):
    model = http.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPTS[2], "max_tokens": 100, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        assert http.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
        frozen = _generated_tokens(http)
        time.sleep(1.0)
        assert _generated_tokens(http) == frozen  # kept in the scheduler, no step ran
        assert http.post("/resume").json() == {"status": "resumed"}
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert _generated_tokens(http) > frozen

    # mode=wait returns once the request in flight finished on its own.
    with http.stream("POST", "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        assert http.post("/pause", params={"mode": "wait"}).json() == {"status": "paused"}
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert http.post("/resume").json() == {"status": "resumed"}
