"""Prefill/decode disaggregation over the network (P2pZmqConnector), on CPU and on the
fake HPU: a prefill server and a decode server behind examples/disagg_proxy_server.py
answer 16 greedy prompts exactly as one instance does; the decode server computes no prompt token but the last
(its vllm:prompt_tokens_by_source metrics say so); a prefill instance killed before
the decode instance pulled the KV makes that request fail with an error, not hang.

The tests run in file order for each platform: the last one kills the prefill server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.conftest import RemoteServer, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_TOKENS = 8
KV_TIMEOUT_S = 3.0


PLATFORMS = {
    "cpu": ({"VLLM_BATCH_INVARIANT": "1"}, 16),
    # The fake HPU with HPU graphs, few buckets (a warmup of seconds), 4 sequences a step.
    "fake_hpu": ({"VLLM_USE_FAKE_HPU": "1", "VLLM_TARGET_DEVICE": "hpu",
                  "PT_HPU_LAZY_MODE": "1", "OMP_NUM_THREADS": "1",
                  "VLLM_PROMPT_BS_BUCKET_MAX": "2", "VLLM_PROMPT_SEQ_BUCKET_MAX": "128",
                  "VLLM_DECODE_BS_BUCKET_MAX": "4"}, 4),
}
"""Environment and max_num_seqs of the servers per platform."""


def _server_args(model: str, kv_config: dict, max_num_seqs: int) -> list[str]:
    return ["--model", model, "--dtype", "float32", "--max-model-len", "512",
            "--max-num-seqs", str(max_num_seqs), "--kv-cache-memory-bytes", str(16 << 20),
            "--disable-log-requests", "--enable-prompt-tokens-details",
            "--kv-transfer-config", json.dumps(kv_config)]


class Proxy:
    def __init__(self, prefill: str, decode: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "examples", "disagg_proxy_server.py"),
             "--prefill", prefill, "--decode", decode, "--port", str(self.port),
             "--timeout-s", "60"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("proxy not ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module", params=list(PLATFORMS))
def pd(request, tiny_model_factory):
    model = tiny_model_factory("llama")
    kv_port = free_port()
    env, max_num_seqs = PLATFORMS[request.param]
    configs = [{"kv_connector": "P2pZmqConnector", "kv_role": "kv_producer",
                "kv_port": kv_port},
               {"kv_connector": "P2pZmqConnector", "kv_role": "kv_consumer",
                "kv_connector_extra_config": {"timeout_s": KV_TIMEOUT_S}}]
    # Both servers start at once (each waits for its own /health).
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(RemoteServer, _server_args(model, c, max_num_seqs), env=env)
                   for c in configs]
    started = [f.result() for f in futures if f.exception() is None]
    proxy = None
    try:
        for f in futures:
            if f.exception() is not None:
                raise f.exception()
        prefill, decode = started
        if request.param == "fake_hpu":
            for srv in started:
                srv.log.flush()
                with open(srv.log.name) as f:
                    assert "HPU execution mode: HPU graphs" in f.read()
        proxy = Proxy(prefill.url, decode.url)
        yield prefill, decode, proxy
    finally:
        for part in [proxy, *started]:
            if part is not None:
                part.stop()


def _prompts() -> list[list[int]]:
    """16 token-id prompts of 9 .. 84 tokens (partial last blocks included)."""
    return [[(7 * i + 13 * j) % 4000 + 100 for j in range(9 + 5 * i)] for i in range(16)]


def _complete(url: str, prompt, **extra) -> dict:
    body = {"model": None, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _by_source(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:prompt_tokens_by_source_total":
                out[s.labels["source"]] = s.value
    return out


def _parallel(fn, items):
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def test_proxy_outputs_equal_one_instance_and_decode_computes_no_prompt(pd):
    prefill, decode, proxy = pd
    prompts = _prompts()
    # One instance: the prefill server itself, plain requests (nothing is published).
    reference = _parallel(lambda p: _complete(prefill.url, p)["choices"][0]["text"], prompts)
    before = _by_source(decode.url)
    answers = _parallel(lambda p: _complete(proxy.url, p), prompts)
    assert [a["choices"][0]["text"] for a in answers] == reference
    assert len(set(reference)) > 1  # the outputs depend on the prompt (a real check)
    after = _by_source(decode.url)
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert grew["external_kv_transfer"] == sum(len(p) - 1 for p in prompts)
    assert grew["local_compute"] == len(prompts)  # the last prompt token only
    assert grew["local_cache_hit"] == 0
    # vLLM's usage counts the loaded tokens as cached (local + external).
    assert [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers] == \
        [len(p) - 1 for p in prompts]


def test_streamed_through_proxy_and_kv_transfer_params(pd):
    prefill, decode, proxy = pd
    prompt = _prompts()[3]
    first = _complete(prefill.url, prompt, max_tokens=1,
                      kv_transfer_params={"do_remote_decode": True})
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_num_tokens"] == len(prompt)
    full = _complete(decode.url, prompt, kv_transfer_params=params)
    assert full["choices"][0]["text"] == _complete(prefill.url, prompt)["choices"][0]["text"]
    # The same KV cannot be fetched twice: the producer hands it out once.
    again = httpx.post(decode.url + "/v1/completions", json={
        "prompt": prompt, "max_tokens": 2, "kv_transfer_params": params}, timeout=60)
    assert again.status_code == 500 and "KV cache could not be loaded" in again.text
    text = ""
    with httpx.stream("POST", proxy.url + "/v1/completions", json={
            "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    assert text == full["choices"][0]["text"]
    # Chat goes through the proxy the same way.
    chat = {"messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    direct = httpx.post(prefill.url + "/v1/chat/completions", json=chat, timeout=60)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=chat, timeout=60)
    assert direct.status_code == proxied.status_code == 200, proxied.text
    assert (proxied.json()["choices"][0]["message"]["content"]
            == direct.json()["choices"][0]["message"]["content"])


def test_bad_kv_transfer_params_are_400(pd):
    prefill, decode, _ = pd
    resp = httpx.post(decode.url + "/v1/completions", json={
        "prompt": "hi", "max_tokens": 2, "kv_transfer_params": {"do_remote_prefill": True}},
        timeout=30)
    assert resp.status_code == 400 and "remote_host" in resp.text
    resp = httpx.post(decode.url + "/v1/completions", json={
        "prompt": "hi", "max_tokens": 2, "kv_transfer_params": {"do_remote_decode": True}},
        timeout=30)
    assert resp.status_code == 400 and "kv_role" in resp.text


def test_killed_prefill_fails_the_request_cleanly(pd):
    prefill, decode, proxy = pd
    prompt = _prompts()[5]
    params = _complete(prefill.url, prompt, max_tokens=1,
                       kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
    prefill.proc.send_signal(signal.SIGKILL)
    prefill.proc.wait(30)
    start = time.monotonic()
    resp = httpx.post(decode.url + "/v1/completions", json={
        "prompt": prompt, "max_tokens": MAX_TOKENS, "kv_transfer_params": params}, timeout=60)
    took = time.monotonic() - start
    assert resp.status_code == 500, resp.text
    assert resp.json()["error"]["type"] == "InternalServerError"
    assert took < KV_TIMEOUT_S + 10
    # Streamed: the stream ends with an error event, then [DONE].
    with httpx.stream("POST", decode.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Spell the word orphan backwards."}],
            "max_tokens": 4, "stream": True,
            # All of this prompt but its last token is to come from the dead producer
            # (its chat-template prefix may be in the local prefix cache: not the rest).
            "kv_transfer_params": dict(params, remote_num_tokens=10**6)}, timeout=60) as resp:
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert '"InternalServerError"' in lines[-2] and lines[-1] == "data: [DONE]"
    # The decode instance is still healthy and serves everything else.
    assert httpx.get(decode.url + "/health", timeout=10).status_code == 200
    assert _complete(decode.url, prompt)["choices"][0]["finish_reason"] == "length"
    # Through the proxy: its prefill leg fails at once (502), nothing hangs.
    resp = httpx.post(proxy.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                      timeout=60)
    assert resp.status_code == 502
