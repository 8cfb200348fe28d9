"""Online serving benchmark: streams requests to an OpenAI-compatible server and times them.

Same flags and report as vLLM's script. Requests arrive as a Poisson process (or a gamma
process with ``--burstiness``), optionally capped by ``--max-concurrency``; every
response is streamed (SSE) so the client sees each token's arrival:

- TTFT: request sent -> first streamed chunk.
- ITL: gaps between consecutive chunks.
- TPOT: (E2E latency - TTFT) / (output tokens - 1), per request.
- E2EL: request sent -> last chunk.

Output tokens come from the stream's ``usage`` when the server sends it, otherwise from
tokenizing the generated text. Failed requests are counted and their errors kept.
"""
from __future__ import annotations

import os


import argparse
import asyncio
import json
import logging
import math
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

import aiohttp
import numpy as np

from vllm.benchmarks.datasets import (SampleRequest, add_dataset_args, get_requests, get_tokenizer,
                                 resolve_dataset_name)

logger = logging.getLogger("vllm.benchmarks.serving")

# Long enough for any benchmark; a stuck server still ends the run eventually.
AIOHTTP_TIMEOUT = aiohttp.ClientTimeout(total=6 * 60 * 60)
METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


# --------------------------------------------------------------------------- requests
@dataclass
class RequestFuncInput:
    prompt: str
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    ignore_eos: bool = False
    logprobs: Optional[int] = None


@dataclass
class RequestFuncOutput:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""


async def iter_sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """Yield the data of each server-sent event (multi-line data joined with newlines)."""
    data_lines: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data_lines:
                yield "\n".join(data_lines)
                data_lines = []
            continue
        if line.startswith(":"):
            continue  # SSE comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            data_lines.append(value[1:] if value.startswith(" ") else value)
    if data_lines:
        yield "\n".join(data_lines)


def _auth_headers() -> dict[str, str]:
    from vllm import envs
    key = envs.OPENAI_API_KEY
    return {"Authorization": f"Bearer {key}"} if key else {}


def _completions_payload(inp: RequestFuncInput) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": inp.model, "prompt": inp.prompt, "temperature": 0.0,
                               "max_tokens": inp.output_len, "stream": True,
                               "stream_options": {"include_usage": True}}
    if inp.logprobs is not None:
        payload["logprobs"] = inp.logprobs
    if inp.ignore_eos:
        payload["ignore_eos"] = True
    return payload


def _chat_payload(inp: RequestFuncInput) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": inp.model,
                               "messages": [{"role": "user", "content": inp.prompt}],
                               "temperature": 0.0, "max_completion_tokens": inp.output_len,
                               "stream": True, "stream_options": {"include_usage": True}}
    if inp.logprobs is not None:
        payload["logprobs"] = True
        payload["top_logprobs"] = inp.logprobs
    if inp.ignore_eos:
        payload["ignore_eos"] = True
    return payload


def _completion_text(choice: dict[str, Any]) -> str:
    return choice.get("text") or ""


def _chat_text(choice: dict[str, Any]) -> str:
    return (choice.get("delta") or {}).get("content") or ""


async def _stream_request(inp: RequestFuncInput, session: aiohttp.ClientSession,
                          payload: dict[str, Any],
                          text_of: Callable[[dict[str, Any]], str]) -> RequestFuncOutput:
    """POST one streaming request and time every chunk that carries a choice."""
    out = RequestFuncOutput(prompt_len=inp.prompt_len)
    text_parts: list[str] = []
    start = time.perf_counter()
    last: Optional[float] = None
    try:
        async with session.post(inp.api_url, json=payload, headers=_auth_headers()) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status} {resp.reason}: {await resp.text()}"
                return out
            async for data in iter_sse_data(resp.content):
                if data.strip() == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = json.dumps(chunk["error"])
                    return out
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if last is None:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                    text_parts.append(text_of(chunk["choices"][0]))
                if chunk.get("usage"):
                    out.output_tokens = chunk["usage"].get("completion_tokens") or 0
        out.generated_text = "".join(text_parts)
        if last is None:
            out.error = "Never received a chunk with a choice: no TTFT; request failed."
        else:
            out.success = True
            out.latency = last - start
    except Exception:  # a benchmark records every failure rather than stopping
        out.error = traceback.format_exc()
    return out


async def request_openai_completions(inp: RequestFuncInput,
                                     session: aiohttp.ClientSession) -> RequestFuncOutput:
    return await _stream_request(inp, session, _completions_payload(inp), _completion_text)


async def request_openai_chat(inp: RequestFuncInput,
                              session: aiohttp.ClientSession) -> RequestFuncOutput:
    return await _stream_request(inp, session, _chat_payload(inp), _chat_text)


REQUEST_FUNCS = {
    "vllm": request_openai_completions,
    "openai": request_openai_completions,
    "openai-chat": request_openai_chat,
}
DEFAULT_ENDPOINTS = {"vllm": "/v1/completions", "openai": "/v1/completions",
                     "openai-chat": "/v1/chat/completions"}


# --------------------------------------------------------------------------- arrivals
async def arrivals(requests: list[SampleRequest], request_rate: float, burstiness: float,
                   seed: int) -> AsyncIterator[SampleRequest]:
    """Yield requests spaced by gamma(burstiness, 1 / (rate * burstiness)) gaps.

    burstiness 1 is a Poisson process; an infinite rate sends everything at once. The
    first request goes out immediately and nothing waits after the last one.
    """
    rng = np.random.default_rng(seed)
    for i, req in enumerate(requests):
        if i and not math.isinf(request_rate):
            await asyncio.sleep(rng.gamma(shape=burstiness,
                                          scale=1.0 / (request_rate * burstiness)))
        yield req


# --------------------------------------------------------------------------- metrics
@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    duration: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    samples: dict[str, list[float]]  # seconds, per metric name
    percentiles: list[float]

    def stats_ms(self, metric: str) -> dict[str, float]:
        """mean/median/std and each requested percentile of one metric, in ms."""
        values = np.array(self.samples[metric] or [0.0]) * 1000
        stats = {f"mean_{metric}_ms": float(values.mean()),
                 f"median_{metric}_ms": float(np.median(values)),
                 f"std_{metric}_ms": float(values.std())}
        for p in self.percentiles:
            stats[f"p{_p_word(p)}_{metric}_ms"] = float(np.percentile(values, p))
        return stats


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def count_output_tokens(out: RequestFuncOutput, tokenizer: Any) -> int:
    if out.output_tokens:
        return out.output_tokens
    return len(tokenizer(out.generated_text, add_special_tokens=False).input_ids)


def calculate_metrics(requests: list[SampleRequest], outputs: list[RequestFuncOutput],
                      duration: float, tokenizer: Any,
                      percentiles: list[float]) -> tuple[BenchmarkMetrics, list[int]]:
    """Aggregate per-request timings; failed requests add nothing but their count."""
    output_lens: list[int] = []
    samples: dict[str, list[float]] = {m: [] for m in METRICS}
    total_input = completed = 0
    for req, out in zip(requests, outputs):
        if not out.success:
            output_lens.append(0)
            continue
        n_out = count_output_tokens(out, tokenizer)
        output_lens.append(n_out)
        total_input += req.prompt_len
        completed += 1
        if n_out > 1:
            samples["tpot"].append((out.latency - out.ttft) / (n_out - 1))
        samples["ttft"].append(out.ttft)
        samples["itl"].extend(out.itl)
        samples["e2el"].append(out.latency)
    if completed == 0:
        logger.warning("All requests failed; check the server and the benchmark arguments.")
    total_output = sum(output_lens)
    metrics = BenchmarkMetrics(
        completed=completed, failed=len(outputs) - completed, total_input=total_input,
        total_output=total_output, duration=duration,
        request_throughput=completed / duration, output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration, samples=samples,
        percentiles=percentiles)
    return metrics, output_lens


def format_report(metrics: BenchmarkMetrics, selected: list[str],
                  max_concurrency: Optional[int]) -> str:
    """vLLM's result table: 40-column labels, 50-column rules."""
    row = "{:<40} {:<10}".format
    rowf = "{:<40} {:<10.2f}".format
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             row("Successful requests:", metrics.completed),
             row("Failed requests:", metrics.failed)]
    if max_concurrency is not None:
        lines.append(row("Maximum request concurrency:", max_concurrency))
    lines += [rowf("Benchmark duration (s):", metrics.duration),
              row("Total input tokens:", metrics.total_input),
              row("Total generated tokens:", metrics.total_output),
              rowf("Request throughput (req/s):", metrics.request_throughput),
              rowf("Output token throughput (tok/s):", metrics.output_throughput),
              rowf("Total Token throughput (tok/s):", metrics.total_token_throughput)]
    for metric in METRICS:
        if metric not in selected:
            continue
        short, title = METRIC_TITLES[metric]
        stats = metrics.stats_ms(metric)
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines.append(rowf(f"Mean {short} (ms):", stats[f"mean_{metric}_ms"]))
        lines.append(rowf(f"Median {short} (ms):", stats[f"median_{metric}_ms"]))
        for p in metrics.percentiles:
            lines.append(rowf(f"P{_p_word(p)} {short} (ms):",
                              stats[f"p{_p_word(p)}_{metric}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)


# --------------------------------------------------------------------------- run
@dataclass
class BenchmarkConfig:
    backend: str
    api_url: str
    model: str
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: Optional[int] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    seed: int = 0
    disable_tqdm: bool = False
    initial_test: bool = True


def _request_input(cfg: BenchmarkConfig, req: SampleRequest) -> RequestFuncInput:
    return RequestFuncInput(prompt=req.prompt, api_url=cfg.api_url, prompt_len=req.prompt_len,
                            output_len=req.expected_output_len, model=cfg.model,
                            ignore_eos=cfg.ignore_eos, logprobs=cfg.logprobs)


async def run_benchmark(cfg: BenchmarkConfig, requests: list[SampleRequest]
                        ) -> tuple[list[RequestFuncOutput], float]:
    """Send every request on schedule; returns outputs (request order) and the duration."""
    request_func = REQUEST_FUNCS[cfg.backend]
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0)
    async with aiohttp.ClientSession(timeout=AIOHTTP_TIMEOUT, connector=connector,
                                     trust_env=True) as session:
        if cfg.initial_test:
            print("Starting initial single prompt test run...")
            test = await request_func(_request_input(cfg, requests[0]), session)
            if not test.success:
                raise ValueError("Initial test run failed - check the server URL, --model "
                                 f"and the request arguments. Error: {test.error}")
            print("Initial test run completed. Starting main benchmark run...")
        print(f"Traffic request rate: {cfg.request_rate}")
        print(f"Burstiness factor: {cfg.burstiness} "
              f"({'Poisson process' if cfg.burstiness == 1.0 else 'Gamma distribution'})")
        print(f"Maximum request concurrency: {cfg.max_concurrency}")
        progress = None
        if not cfg.disable_tqdm:
            from tqdm import tqdm
            progress = tqdm(total=len(requests))
        limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None

        async def one(req: SampleRequest) -> RequestFuncOutput:
            if limit is None:
                out = await request_func(_request_input(cfg, req), session)
            else:
                async with limit:
                    out = await request_func(_request_input(cfg, req), session)
            if progress is not None:
                progress.update(1)
            return out

        start = time.perf_counter()
        tasks = [asyncio.create_task(one(req)) async for req in
                 arrivals(requests, cfg.request_rate, cfg.burstiness, cfg.seed)]
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        if progress is not None:
            progress.close()
    return list(outputs), duration


def build_result(cfg: BenchmarkConfig, args: argparse.Namespace, metrics: BenchmarkMetrics,
                 output_lens: list[int], outputs: list[RequestFuncOutput]) -> dict[str, Any]:
    """Everything measured, aggregate and per request (the --save-result JSON)."""
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": cfg.backend,
        "model_id": args.model, "tokenizer_id": args.tokenizer or args.model,
        "num_prompts": len(outputs),
        "request_rate": cfg.request_rate if not math.isinf(cfg.request_rate) else "inf",
        "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency,
        "duration": metrics.duration, "completed": metrics.completed,
        "failed": metrics.failed, "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
    }
    for metric in METRICS:
        result.update(metrics.stats_ms(metric))
    result.update({
        "input_lens": [o.prompt_len for o in outputs], "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
        "e2els": [o.latency for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs]})
    return result


def result_path(args: argparse.Namespace) -> str:
    if args.result_filename:
        name = args.result_filename
    else:
        concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = (f"{args.backend}-{args.request_rate}qps{concurrency}-"
                f"{args.model.rstrip('/').split('/')[-1]}-"
                f"{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    return os.path.join(args.result_dir, name) if args.result_dir else name


# --------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    add_cli_args(parser)
    return parser


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The flags (also `vllm bench serve`'s)."""
    from vllm.config import DEFAULT_MODEL
    parser.add_argument("--backend", type=str, default="vllm", choices=list(REQUEST_FUNCS))
    parser.add_argument("--base-url", type=str, default=None,
                        help="Server base URL (e.g. http://host:8000); overrides host/port.")
    parser.add_argument("--host", type=str, default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--endpoint", type=str, default=None,
                        help="API path; default /v1/completions, or /v1/chat/completions "
                             "for openai-chat.")
    parser.add_argument("--model", type=str, default=DEFAULT_MODEL,
                        help="Model name sent in requests (and the tokenizer's default).")
    parser.add_argument("--served-model-name", type=str, default=None,
                        help="Name sent in requests when it differs from --model.")
    parser.add_argument("--tokenizer", type=str, default=None,
                        help="Tokenizer for lengths (default: --model).")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="Requests per second (Poisson arrivals); inf sends all at once.")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="Gamma shape of arrival gaps; 1 = Poisson, < 1 burstier.")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="Most requests in flight at once.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ignore-eos", action="store_true",
                        help="Ask the server to ignore EOS (vLLM extension).")
    parser.add_argument("--logprobs", type=int, default=None,
                        help="Logprobs per token to request.")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--skip-initial-test", action="store_true",
                        help="Do not send the single-request check before the run.")
    parser.add_argument("--save-result", action="store_true",
                        help="Write the metrics and per-request data to a JSON file.")
    parser.add_argument("--result-dir", type=str, default=None)
    parser.add_argument("--result-filename", type=str, default=None)
    parser.add_argument("--percentile-metrics", type=str, default="ttft,tpot,itl,e2el",
                        help=f"Comma-separated metrics to report, from {','.join(METRICS)}.")
    parser.add_argument("--metric-percentiles", type=str, default="99",
                        help="Comma-separated percentiles to report (e.g. 25,50,99).")
    add_dataset_args(parser, default_input_len=1024, default_output_len=None)


def parse_metric_args(args: argparse.Namespace) -> tuple[list[str], list[float]]:
    selected = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = [m for m in selected if m not in METRICS]
    if unknown:
        raise ValueError(f"percentile_metrics: unknown {unknown}; allowed: {list(METRICS)}.")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    except ValueError as e:
        raise ValueError(f"metric_percentiles must be numbers in (0, 100]: {e}") from e
    if not percentiles or any(not 0 < p <= 100 for p in percentiles):
        raise ValueError(f"metric_percentiles must be numbers in (0, 100], got "
                         f"{args.metric_percentiles!r}.")
    return selected, percentiles


def make_config(args: argparse.Namespace) -> BenchmarkConfig:
    if not args.request_rate > 0:
        raise ValueError(f"request_rate must be > 0 (or inf), got {args.request_rate}.")
    if not args.burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {args.burstiness}.")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {args.max_concurrency}.")
    if args.num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {args.num_prompts}.")
    endpoint = args.endpoint or DEFAULT_ENDPOINTS[args.backend]
    if args.backend == "openai-chat" and not endpoint.rstrip("/").endswith("chat/completions"):
        raise ValueError(f"endpoint={endpoint!r}: backend openai-chat needs a "
                         "chat/completions endpoint.")
    if args.backend != "openai-chat" and not endpoint.rstrip("/").endswith("completions"):
        raise ValueError(f"endpoint={endpoint!r}: backend {args.backend} needs a completions "
                         "endpoint.")
    base = args.base_url.rstrip("/") if args.base_url else f"http://{args.host}:{args.port}"
    return BenchmarkConfig(
        backend=args.backend, api_url=base + endpoint,
        model=args.served_model_name or args.model, request_rate=args.request_rate,
        burstiness=args.burstiness, max_concurrency=args.max_concurrency,
        ignore_eos=args.ignore_eos, logprobs=args.logprobs, seed=args.seed,
        disable_tqdm=args.disable_tqdm, initial_test=not args.skip_initial_test)


def main(args: argparse.Namespace) -> dict[str, Any]:
    selected, percentiles = parse_metric_args(args)
    cfg = make_config(args)
    if args.output_len is None and resolve_dataset_name(args) == "random":
        args.output_len = 128  # vLLM's --random-output-len default
    try:
        tokenizer = get_tokenizer(args.tokenizer or args.model)
    except ValueError as e:
        raise ValueError(f"tokenizer: {e} Pass --tokenizer with a local model directory or "
                         ".gguf file when --model is only the served name.") from e
    requests = get_requests(args, tokenizer)
    outputs, duration = asyncio.run(run_benchmark(cfg, requests))
    metrics, output_lens = calculate_metrics(requests, outputs, duration, tokenizer,
                                             percentiles)
    print(format_report(metrics, selected, cfg.max_concurrency))
    result = build_result(cfg, args, metrics, output_lens, outputs)
    if args.save_result:
        path = result_path(args)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, ensure_ascii=False)
        print(f"Saved results to {path}")
    return result


if __name__ == "__main__":
    main(build_parser().parse_args())
