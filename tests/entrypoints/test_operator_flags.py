"""vLLM's operator flags of the server, each checked on an in-process app over the fake
engine: --disable-fastapi-docs, --enable-request-id-headers, --enable-force-include-usage,
--enable-server-load-tracking, --log-level, the HTTP metrics and the sleep-state gauge."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.test_cli_and_app import run_app as run_app_with


def run_app(tokenizer, argv: list[str], requests):
    return run_app_with(tokenizer, argv, requests, start_loop=True)


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


COMPLETION = {"model": "fake-model", "prompt": "hi", "max_tokens": 3}


def test_http_metrics_and_default_families(tokenizer):
    async def requests(client):
        await client.post("/v1/completions", json=COMPLETION)
        await client.get("/health")
        return (await client.get("/metrics")).text

    found = samples(run_app(tokenizer, [], requests))
    hits = [s for s in found["http_requests_total"] if s.labels["handler"] == "/v1/completions"]
    assert hits and hits[0].labels["method"] == "POST" and hits[0].labels["status"] == "2xx"
    assert not [s for s in found["http_requests_total"] if s.labels["handler"] == "/health"]
    for name in ("http_request_duration_seconds_bucket", "http_request_size_bytes_sum",
                 "http_response_size_bytes_sum", "http_request_duration_highr_seconds_bucket"):
        assert name in found, name
    sleep = {s.labels["sleep_state"]: s.value for s in found["vllm:engine_sleep_state"]}
    assert sleep == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    # The opt-in families are absent by default.
    for name in ("vllm:kv_block_lifetime_seconds_count", "vllm:estimated_flops_per_gpu_total",
                 "vllm:gpu_cache_usage_perc"):
        assert name not in found


def test_docs_are_served_unless_disabled(tokenizer):
    async def requests(client):
        return [(await client.get(p)).status_code for p in ("/docs", "/openapi.json")]

    assert run_app(tokenizer, [], requests) == [200, 200]
    assert run_app(tokenizer, ["--disable-fastapi-docs"], requests) == [404, 404]


def test_request_id_headers(tokenizer):
    async def requests(client):
        mine = await client.get("/v1/models", headers={"X-Request-Id": "abc-123"})
        new = await client.get("/v1/models")
        return mine.headers.get("x-request-id"), new.headers.get("x-request-id")

    assert run_app(tokenizer, [], requests) == (None, None)
    mine, new = run_app(tokenizer, ["--enable-request-id-headers"], requests)
    assert mine == "abc-123" and new and len(new) == 32


def test_force_include_usage(tokenizer):
    async def requests(client):
        r = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        return chunks[-1].get("usage")

    assert run_app(tokenizer, [], requests) is None
    usage = run_app(tokenizer, ["--enable-force-include-usage"], requests)
    assert usage["completion_tokens"] == 3


def test_server_load_tracking(tokenizer):
    async def requests(client):
        async def load_while_busy():
            await asyncio.sleep(0.05)
            return (await client.get("/load")).json()["server_load"]

        slow = client.post("/v1/completions", json={**COMPLETION, "max_tokens": 60})
        _, load = await asyncio.gather(slow, load_while_busy())
        return load

    assert run_app(tokenizer, [], requests) == 0
    assert run_app(tokenizer, ["--enable-server-load-tracking"], requests) == 1


def test_log_level_flag_parses_and_sets_the_vllm_logger():
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    args = make_arg_parser().parse_args(["--log-level", "warning", "--uvicorn-log-level",
                                         "error"])
    assert args.log_level == "warning" and args.uvicorn_log_level == "error"
    with pytest.raises(SystemExit):
        make_arg_parser().parse_args(["--log-level", "loud"])
    logger = logging.getLogger("vllm")
    before = logger.level
    try:
        from vllm.entrypoints.openai import api_server
        api_server._apply_log_level(args)
        assert logger.level == logging.WARNING
    finally:
        logger.setLevel(before)
