"""Development routes (VLLM_SERVER_DEV_MODE=1): sleep mode and the prefix cache.

One real server (tiny model, sleep mode enabled, dev mode on) for the module; the
routes' absence without dev mode is checked on an in-process app over a fake engine.
"""
from __future__ import annotations

import asyncio
import signal

import httpx
import pytest
from tests.entrypoints.conftest import RemoteServer
from fake_engine import FakeLLMEngine

DEV_ROUTES = [("post", "/sleep"), ("post", "/wake_up"), ("get", "/is_sleeping"),
              ("post", "/reset_prefix_cache"), ("post", "/start_profile"),
              ("post", "/stop_profile"), ("get", "/server_info"), ("post", "/collective_rpc"),
              # vLLM's RL routes (rlhf_routes.py)
              ("post", "/pause"), ("post", "/resume"), ("get", "/is_paused"),
              ("post", "/init_weight_transfer_engine"), ("post", "/start_weight_update"),
              ("post", "/update_weights"), ("post", "/finish_weight_update"),
              ("post", "/update_weight_version"), ("get", "/weight_info"),
              ("get", "/get_world_size")]


@pytest.fixture(scope="module")
def dev_server(tiny_model_factory, tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("traces")
    srv = RemoteServer([
        "--model", tiny_model_factory("llama"), "--dtype", "float32", "--max-model-len",
        "256", "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(32 << 20),
        "--enable-sleep-mode", "--disable-log-requests"],
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_TORCH_PROFILER_DIR": str(trace_dir),
             "VLLM_TORCH_PROFILER_WITH_STACK": "0"})
    srv.trace_dir = trace_dir
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


@pytest.fixture(scope="module")
def http(dev_server):
    with httpx.Client(base_url=dev_server.url, timeout=120) as c:
        yield c


def _complete(http) -> httpx.Response:
    return http.post("/v1/completions", json={
        "model": http.get("/v1/models").json()["data"][0]["id"], "prompt": "Hello there",
        "max_tokens": 8, "temperature": 0.0})


def test_dev_routes_are_absent_without_dev_mode(monkeypatch):
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.transformers_utils.tokenizer import get_tokenizer
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    engine = AsyncLLMEngine(FakeLLMEngine(get_tokenizer(resolve_model_path(DEFAULT_MODEL))),
                            log_requests=False, log_stats=False)
    app = build_app(make_arg_parser().parse_args([]), engine)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await getattr(client, verb)(path) for verb, path in DEV_ROUTES]

    try:
        statuses = [r.status_code for r in asyncio.run(main())]
    finally:
        engine.shutdown()
    assert statuses == [404] * len(DEV_ROUTES)


def test_sleep_wake_up_toggle_is_sleeping_and_output_is_unchanged(http):
    first = _complete(http)
    assert first.status_code == 200, first.text
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert http.post("/sleep", params={"level": 2}).status_code == 200
    assert http.get("/is_sleeping").json() == {"is_sleeping": True}
    refused = _complete(http)
    assert refused.status_code == 400
    assert "sleeping" in refused.json()["error"]["message"]
    assert http.post("/wake_up", params={"tags": "weights"}).status_code == 200
    assert http.get("/is_sleeping").json() == {"is_sleeping": True}  # KV cache still out
    assert http.post("/wake_up").status_code == 200
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    again = _complete(http)
    assert again.status_code == 200
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]


def test_bad_sleep_requests_are_openai_errors(http):
    for params in ({"level": 3}, {"level": "deep"}):
        response = http.post("/sleep", params=params)
        assert response.status_code == 400
        assert "level" in response.json()["error"]["message"]
    response = http.post("/wake_up", params={"tags": "gpu"})
    assert response.status_code == 400
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}


def test_reset_prefix_cache(http):
    assert _complete(http).status_code == 200
    assert http.post("/reset_prefix_cache").status_code == 200
    assert _complete(http).status_code == 200


def test_profile_routes_write_a_trace(dev_server, http):
    response = http.post("/stop_profile")
    assert response.status_code == 400 and "not running" in response.text
    assert http.post("/start_profile").status_code == 200
    assert _complete(http).status_code == 200
    assert http.post("/stop_profile").status_code == 200
    assert list(dev_server.trace_dir.glob("rank0.*.pt.trace.json.gz"))


def test_server_info_and_collective_rpc(http):
    text = http.get("/server_info").json()
    assert "VllmConfig(" in text["vllm_config"] and text["vllm_env"]["VLLM_SERVER_DEV_MODE"] is True
    as_json = http.get("/server_info", params={"config_format": "json"}).json()
    assert as_json["vllm_config"]["model_config"]["max_model_len"] == 256
    assert http.get("/server_info", params={"config_format": "xml"}).status_code == 400
    rpc = http.post("/collective_rpc", json={"method": "get_device_index"})
    assert rpc.status_code == 200 and rpc.json() == {"results": ["0"]}, rpc.text
    assert http.post("/collective_rpc", json={"args": []}).status_code == 400
