"""benchmark_serving.py against an in-test SSE stub server and against the real server."""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from aiohttp import web

from benchmarks import benchmark_serving as bs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StubServer:
    """A loopback OpenAI-style streaming server whose answers the tests control.

    Each request streams one chunk per requested token (" w<i>"), split across SSE
    lines with keep-alive comments in between, then a usage chunk and [DONE]. Every
    `fail_every`-th request (counted from 1) gets a 400 error instead; `stream_error`
    makes it an in-stream error event.
    """

    def __init__(self, fail_every: int = 0, stream_error: bool = False,
                 send_usage: bool = True, delay: float = 0.0):
        self.fail_every = fail_every
        self.stream_error = stream_error
        self.send_usage = send_usage
        self.delay = delay
        self.payloads: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.payloads.append(body)
        n = len(self.payloads)
        chat = "messages" in body
        if self.fail_every and n % self.fail_every == 0 and not self.stream_error:
            return web.json_response({"error": {"message": f"stub failure {n}", "type":
                                      "BadRequestError", "param": None, "code": 400}},
                                     status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.fail_every and n % self.fail_every == 0:
            await resp.write(b'data: {"error": {"message": "stream broke", "code": 500}}\n\n')
            await resp.write(b"data: [DONE]\n\n")
            return resp
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if chat:  # role-only first chunk, as real servers send
            await resp.write(self._event({"choices": [{"index": 0, "delta":
                                                       {"role": "assistant"}}]}))
        for i in range(max_tokens):
            await asyncio.sleep(self.delay)
            choice = ({"index": 0, "delta": {"content": f" w{i}"}} if chat
                      else {"index": 0, "text": f" w{i}"})
            await resp.write(b": keep-alive\n")
            await resp.write(self._event({"choices": [choice]}, split=True))
        if self.send_usage:
            await resp.write(self._event({"choices": [], "usage": {
                "prompt_tokens": 1, "completion_tokens": max_tokens,
                "total_tokens": 1 + max_tokens}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    @staticmethod
    def _event(obj: dict, split: bool = False) -> bytes:
        text = json.dumps(obj)
        if split:  # SSE allows one event's data over several lines; joined with "\n"
            half = text.index(",") + 1
            return f"data: {text[:half]}\ndata: {text[half:]}\n\n".encode()
        return f"data: {text}\n\n".encode()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def stub():
    servers: list[StubServer] = []

    def make(**kw) -> StubServer:
        servers.append(StubServer(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture(scope="module")
def model(tiny_model_factory):
    return tiny_model_factory("llama")


def _bench(capsys, *argv: str) -> tuple[dict, str]:
    args = bs.build_parser().parse_args(["--disable-tqdm", *argv])
    result = bs.main(args)
    return result, capsys.readouterr().out


def _value(stdout: str, label: str) -> float:
    match = re.search(rf"^{re.escape(label)}\s+([\d.]+)\s*$", stdout, re.M)
    assert match, f"{label!r} missing in:\n{stdout}"
    return float(match.group(1))


def test_completions_stream_report_and_saved_result(stub, model, capsys, tmp_path):
    server = stub(delay=0.002)
    result, out = _bench(capsys, "--model", model, "--port", str(server.port),
                         "--num-prompts", "6", "--input-len", "12", "--output-len", "5",
                         "--ignore-eos", "--save-result", "--result-dir", str(tmp_path),
                         "--result-filename", "r.json", "--metric-percentiles", "50,99")
    assert "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=") in out
    assert _value(out, "Successful requests:") == 6
    assert _value(out, "Failed requests:") == 0
    assert _value(out, "Total input tokens:") == 72
    assert _value(out, "Total generated tokens:") == 30
    assert _value(out, "Benchmark duration (s):") == pytest.approx(result["duration"], abs=0.01)
    assert _value(out, "Request throughput (req/s):") == pytest.approx(
        6 / result["duration"], abs=0.01)
    for short in ("TTFT", "TPOT", "ITL", "E2EL"):
        for stat in ("Mean", "Median", "P50", "P99"):
            _value(out, f"{stat} {short} (ms):")
    # 1 initial test + 6 requests, each with the OpenAI streaming payload.
    assert len(server.payloads) == 7
    body = server.payloads[-1]
    assert body["stream"] and body["max_tokens"] == 5 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True} and body["model"] == model
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["completed"] == 6 and saved["output_lens"] == [5] * 6
    assert saved["generated_texts"][0] == " w0 w1 w2 w3 w4"
    assert all(len(itl) == 4 for itl in saved["itls"])  # 5 chunks -> 4 gaps
    assert saved["errors"] == [""] * 6
    assert saved["mean_tpot_ms"] > 0 and "p99_e2el_ms" in saved and "p50_ttft_ms" in saved
    assert result["total_output_tokens"] == 30


def test_chat_backend_counts_tokens_by_tokenizer_without_usage(stub, model, capsys):
    server = stub(send_usage=False)
    result, out = _bench(capsys, "--backend", "openai-chat", "--model", model,
                         "--base-url", f"http://127.0.0.1:{server.port}", "--num-prompts",
                         "3", "--input-len", "8", "--output-len", "4")
    body = server.payloads[-1]
    assert body["messages"][0]["role"] == "user" and body["max_completion_tokens"] == 4
    from benchmarks.datasets import get_tokenizer
    tok = get_tokenizer(model)
    expected = len(tok(" w0 w1 w2 w3", add_special_tokens=False).input_ids)
    assert result["output_lens"] == [expected] * 3
    assert _value(out, "Successful requests:") == 3


@pytest.mark.parametrize("stream_error", [False, True])
def test_failed_requests_are_counted_with_errors(stub, model, capsys, stream_error):
    server = stub(fail_every=2, stream_error=stream_error)
    result, out = _bench(capsys, "--model", model, "--port", str(server.port),
                         "--num-prompts", "6", "--input-len", "8", "--output-len", "3",
                         "--max-concurrency", "1", "--skip-initial-test")
    assert _value(out, "Successful requests:") == 3
    assert _value(out, "Failed requests:") == 3
    assert result["completed"] == 3 and result["failed"] == 3
    errors = [e for e in result["errors"] if e]
    assert len(errors) == 3
    assert all(("stream broke" if stream_error else "stub failure") in e for e in errors)
    assert result["output_lens"].count(0) == 3


def test_initial_test_failure_and_bad_flags(stub, model, capsys):
    server = stub(fail_every=1)
    with pytest.raises(ValueError, match="Initial test run failed.*stub failure"):
        _bench(capsys, "--model", model, "--port", str(server.port), "--num-prompts", "2",
               "--input-len", "8", "--output-len", "3")
    with pytest.raises(ValueError, match="percentile_metrics"):
        _bench(capsys, "--model", model, "--percentile-metrics", "ttft,bogus")
    with pytest.raises(ValueError, match="chat/completions"):
        _bench(capsys, "--model", model, "--backend", "openai-chat", "--endpoint",
               "/v1/completions")
    with pytest.raises(ValueError, match="request_rate"):
        _bench(capsys, "--model", model, "--request-rate", "0")


def test_poisson_arrivals_spread_requests(stub, model, capsys):
    server = stub()
    _, out = _bench(capsys, "--model", model, "--port", str(server.port), "--num-prompts",
                    "8", "--input-len", "8", "--output-len", "2", "--request-rate", "20",
                    "--skip-initial-test")
    # 7 exponential gaps of mean 50 ms: the run cannot finish instantly.
    assert _value(out, "Benchmark duration (s):") > 0.05
    assert "Traffic request rate: 20.0" in out


def test_metrics_math():
    reqs = [bs.SampleRequest("p", 10, 5, [0] * 10), bs.SampleRequest("p", 20, 5, [0] * 20),
            bs.SampleRequest("p", 30, 5, [0] * 30)]
    outs = [bs.RequestFuncOutput(success=True, latency=1.0, output_tokens=5, ttft=0.2,
                                 itl=[0.2] * 4),
            bs.RequestFuncOutput(success=True, latency=0.5, output_tokens=1, ttft=0.5),
            bs.RequestFuncOutput(success=False, error="boom")]
    metrics, lens = bs.calculate_metrics(reqs, outs, 2.0, tokenizer=None, percentiles=[50])
    assert lens == [5, 1, 0]
    assert (metrics.completed, metrics.failed, metrics.total_input) == (2, 1, 30)
    assert metrics.request_throughput == 1.0 and metrics.output_throughput == 3.0
    assert metrics.total_token_throughput == 18.0
    assert metrics.stats_ms("ttft")["mean_ttft_ms"] == pytest.approx(350.0)
    assert metrics.stats_ms("tpot")["mean_tpot_ms"] == pytest.approx(200.0)  # (1-0.2)/4
    assert metrics.stats_ms("e2el")["p50_e2el_ms"] == pytest.approx(750.0)
    report = bs.format_report(metrics, ["ttft"], max_concurrency=4)
    assert "Maximum request concurrency:" in report and "TPOT" not in report


# --------------------------------------------------------------------------- real server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_server(model):
    port = _free_port()
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                             "--model", model, "--port", str(port), "--host", "127.0.0.1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited: {proc.stdout.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail("server did not become healthy in 120 s")
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.parametrize("backend", ["vllm", "openai-chat"])
def test_against_real_server(real_server, model, capsys, backend):
    result, out = _bench(capsys, "--backend", backend, "--model", model, "--port",
                         str(real_server), "--num-prompts", "4", "--input-len", "16",
                         "--output-len", "6", "--ignore-eos", "--max-concurrency", "2")
    assert _value(out, "Successful requests:") == 4, result["errors"]
    assert _value(out, "Total input tokens:") == 64
    assert _value(out, "Total generated tokens:") == 24  # ignore_eos: exactly 6 each
    assert result["mean_ttft_ms"] > 0 and result["mean_e2el_ms"] >= result["mean_ttft_ms"]


def test_vllm_bench_serve_command(stub, model):
    """`vllm bench serve` is this benchmark with its flags (vLLM's sub-command)."""
    srv = stub()
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--base-url",
         f"http://127.0.0.1:{srv.port}", "--model", model, "--dataset-name", "random",
         "--random-input-len", "8", "--random-output-len", "3", "--num-prompts", "5",
         "--disable-tqdm"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert len(srv.payloads) == 5 + 1  # the initial test request, then the 5
    assert re.search(r"^Successful requests:\s+5\s*$", proc.stdout, re.M), proc.stdout
    assert _value(proc.stdout, "Total generated tokens:") == 15
