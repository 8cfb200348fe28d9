"""A user-written logits processor served (`--logits-processors`): per-request arguments
through `vllm_xargs`, validate_params' ValueError a 400, a raising processor a 500 for
its request only (the server goes on)."""
from __future__ import annotations

import signal

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--dtype", "float32",
                        "--max-model-len", "512", "--max-num-seqs", "4",
                        "--kv-cache-memory-bytes", str(32 << 20), "--disable-log-requests",
                        "--logits-processors",
                        "tests.sample.custom_logitsprocs:BanTokenLogitsProcessor",
                        "tests.sample.custom_logitsprocs.ExplodingLogitsProcessor"])
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def _complete(server, **extra) -> httpx.Response:
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    body = dict(model=model, prompt=[1, 450, 4996, 17354], max_tokens=3, temperature=0.0,
                ignore_eos=True, logprobs=0, **extra)
    return httpx.post(server.url + "/v1/completions", json=body, timeout=60)


def _first_token(response: httpx.Response) -> str:
    return response.json()["choices"][0]["logprobs"]["tokens"][0]


def test_served_processor_bans_per_request(server):
    base = _complete(server)
    assert base.status_code == 200, base.text
    tokens = httpx.post(server.url + "/tokenize",
                        json={"model": base.json()["model"],
                              "prompt": _first_token(base),
                              "add_special_tokens": False}).json()["tokens"]
    banned = _complete(server, vllm_xargs={"banned_token_id": tokens[0]})
    assert banned.status_code == 200, banned.text
    assert _first_token(banned) != _first_token(base)
    assert _complete(server).json()["choices"][0]["text"] == base.json()["choices"][0]["text"]


def test_served_validation_and_failure(server):
    bad = _complete(server, vllm_xargs={"banned_token_id": "x"})
    assert bad.status_code == 400 and "banned_token_id must be an int" in bad.text
    failed = _complete(server, vllm_xargs={"explode": True})
    assert failed.status_code == 500, failed.text
    assert _complete(server).status_code == 200  # the engine goes on
