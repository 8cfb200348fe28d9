"""OpenTelemetry tracing (--otlp-traces-endpoint) on a real server: an OTLP/HTTP receiver
started here gets one "llm_request" span per request, with vLLM's attribute names, in
the client's trace (W3C traceparent). Off by default: no opentelemetry import at all."""
from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.entrypoints.conftest import RemoteServer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


class _Receiver:
    """A minimal OTLP/HTTP collector: keeps every ExportTraceServiceRequest it gets."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest, ExportTraceServiceResponse)
        self.spans: list = []
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        received.extend(scope_spans.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


@pytest.fixture(scope="module")
def traced(tiny_model_factory):
    receiver = _Receiver()
    srv = RemoteServer(["--model", tiny_model_factory("llama"), "--dtype", "float32",
                        "--max-model-len", "256", "--served-model-name", "tiny",
                        "--otlp-traces-endpoint", receiver.url, "--disable-log-requests"],
                       env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
    yield srv, receiver
    srv.stop()
    receiver.httpd.shutdown()


def _wait_for_spans(receiver, n: int, timeout_s: float = 30.0) -> list:
    import time
    deadline = time.monotonic() + timeout_s
    while len(receiver.spans) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(receiver.spans)


def test_one_span_per_request_in_the_clients_trace(traced):
    srv, receiver = traced
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}
    r = httpx.post(srv.url + "/v1/completions", headers=headers, timeout=60, json={
        "prompt": "the cat sat on", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 0,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True})
    assert r.status_code == 200
    spans = _wait_for_spans(receiver, 2)
    assert len(spans) == 2
    completion = next(s for s in spans if s.trace_id.hex() == TRACE_ID)
    assert completion.name == "llm_request"
    assert completion.parent_span_id.hex() == PARENT_SPAN_ID
    assert completion.kind == 2  # SPAN_KIND_SERVER
    attrs = _attributes(completion)
    assert attrs["gen_ai.response.model"] == "tiny"
    assert attrs["gen_ai.usage.completion_tokens"] == 5
    assert attrs["gen_ai.usage.prompt_tokens"] == r_prompt_tokens(srv, "the cat sat on")
    assert attrs["gen_ai.request.max_tokens"] == 5
    assert attrs["gen_ai.request.temperature"] == pytest.approx(0.7)
    assert attrs["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert attrs["gen_ai.request.n"] == 1
    assert attrs["gen_ai.request.id"].startswith("cmpl-")
    for name in ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token",
                 "gen_ai.latency.e2e", "gen_ai.latency.time_in_model_prefill",
                 "gen_ai.latency.time_in_model_decode"):
        assert attrs[name] >= 0, name
    assert attrs["gen_ai.latency.e2e"] >= attrs["gen_ai.latency.time_to_first_token"]
    assert completion.end_time_unix_nano > completion.start_time_unix_nano
    chat = next(s for s in spans if s is not completion)
    assert chat.trace_id.hex() != TRACE_ID and not chat.parent_span_id  # a new root
    assert _attributes(chat)["gen_ai.usage.completion_tokens"] == 3


def r_prompt_tokens(srv, prompt: str) -> int:
    return httpx.post(srv.url + "/tokenize", json={"prompt": prompt}).json()["count"]


def test_detailed_traces_are_refused_per_value():
    from vllm.engine.arg_utils import EngineArgs
    for value in (["model"], ["worker"], ["all"]):
        with pytest.raises(ValueError, match="--collect-detailed-traces"):
            EngineArgs(otlp_traces_endpoint="http://127.0.0.1:1/v1/traces",
                       collect_detailed_traces=value).create_engine_config()
    with pytest.raises(ValueError, match="unknown module"):
        EngineArgs(otlp_traces_endpoint="http://x", collect_detailed_traces=["gpu"]
                   ).create_engine_config()


def test_no_opentelemetry_import_when_tracing_is_off(tiny_model_factory):
    code = ("import sys\nfrom vllm import LLM, SamplingParams\n"
            f"llm = LLM(model={tiny_model_factory('llama')!r}, dtype='float32', "
            "max_model_len=64)\n"
            "llm.generate(['a b'], SamplingParams(max_tokens=2), use_tqdm=False)\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
