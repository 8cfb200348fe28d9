"""`vllm run-batch -i INPUT.jsonl -o OUTPUT.jsonl --model ...`: OpenAI's batch file format,
run offline through the server's own routes.

Each input line is a batch request `{"custom_id", "method": "POST", "url", "body"}` with
`url` one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/score,
/v1/rerank (the routes the model serves); each output line is
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` in the
input's order. The requests go to the server app in this process (no socket), all at
once so the engine batches them; a line that cannot be read or whose route refuses it
gets its error in its own output line, and the others run. `-` reads stdin / writes
stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import uuid
from typing import Any, Optional

from tqdm import tqdm

logger = logging.getLogger(__name__)

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/score",
              "/v1/rerank")


def add_run_batch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--input-file", required=True, type=str,
                        help="The batch file (JSON lines), or - for stdin.")
    parser.add_argument("-o", "--output-file", required=True, type=str,
                        help="Where the results go (JSON lines), or - for stdout.")


def read_lines(path: str) -> list[str]:
    if path == "-":
        return [line for line in sys.stdin.read().splitlines() if line.strip()]
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().splitlines() if line.strip()]


def output_line(custom_id: Optional[str], status: int, body: Any,
                error: Any = None) -> dict[str, Any]:
    return {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"vllm-batch-{uuid.uuid4().hex}",
                         "body": body},
            "error": error}


def parse_line(line: str) -> dict[str, Any]:
    """The line's batch request object; ValueError if it is not one."""
    try:
        request = json.loads(line)
    except ValueError as e:
        raise ValueError(f"the line is not JSON: {e}") from None
    if not isinstance(request, dict):
        raise ValueError("the line must be a JSON object")
    return request


def check_request(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(url, body) of a batch request; ValueError naming what is wrong with it."""
    url, body = request.get("url"), request.get("body")
    if request.get("method", "POST") != "POST":
        raise ValueError(f"method {request.get('method')!r}: only POST is supported")
    if url not in BATCH_URLS:
        raise ValueError(f"url {url!r} is not supported; use one of {', '.join(BATCH_URLS)}")
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object (the request of `url`)")
    if body.get("stream"):
        raise ValueError("body.stream: streaming is not supported in a batch")
    return url, body


async def run_line(client: Any, line: str) -> dict[str, Any]:
    custom_id = None
    try:
        request = parse_line(line)
        custom_id = request.get("custom_id")
        url, body = check_request(request)
    except ValueError as e:
        return output_line(custom_id, 400, None, str(e))
    response = await client.post(url, json=body)
    payload = response.json()
    if response.status_code >= 400:
        return output_line(custom_id, response.status_code, None,
                           payload.get("error", payload))
    return output_line(custom_id, response.status_code, payload)


async def run_batch(app: Any, lines: list[str], api_key: Optional[str] = None
                    ) -> list[dict[str, Any]]:
    """Every line's result, in order (the app's lifespan runs around them)."""
    import httpx
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://batch",
                                     headers=headers, timeout=None) as client:
            bar = tqdm(total=len(lines), desc="Running batch", dynamic_ncols=True)

            async def one(line: str) -> dict[str, Any]:
                result = await run_line(client, line)
                bar.update(1)
                return result

            try:
                return await asyncio.gather(*(one(line) for line in lines))
            finally:
                bar.close()


def write_lines(path: str, results: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(args: argparse.Namespace) -> None:
    import vllm.envs as envs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_engine import build_async_engine
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    validate_parsed_serve_args(args)
    lines = read_lines(args.input_file)  # a missing file fails before the model loads
    engine = build_async_engine(AsyncEngineArgs.from_cli_args(args),
                                max_log_len=args.max_log_len)
    try:
        keys = args.api_key or ([envs.VLLM_API_KEY] if envs.VLLM_API_KEY else [])
        key = keys if isinstance(keys, str) else (keys[0] if keys else None)
        results = asyncio.run(run_batch(build_app(args, engine), lines, key))
    finally:
        engine.shutdown()
    write_lines(args.output_file, results)
    failed = sum(1 for r in results if r["error"] is not None)
    logger.info("Batch done: %d requests, %d failed; results in %s.", len(results), failed,
                args.output_file)


def make_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """The server's flags (engine and serving) plus -i / -o."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    parser = make_arg_parser(parser)
    add_run_batch_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
