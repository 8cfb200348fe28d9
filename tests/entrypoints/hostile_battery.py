"""A battery of hostile requests against a live OpenAI server (loopback only, bounded).

Each case is one request (or a small burst) that once hurt a server like this one:
malformed bodies, huge inputs, grammars that compile for minutes or gigabytes, stores
filled with metadata, background responses cancelled together. A case passes when
every answer is a 2xx or a clean 4xx (OpenAI's error body), within `max_seconds`;
afterwards the server must still answer /health and a plain completion.

    python tests/entrypoints/hostile_battery.py --url http://127.0.0.1:8000 [--api-key K]

exits 1 if any case failed. tests/entrypoints/test_hostile_server.py runs it against
its own server.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import httpx

MESSAGES = [{"role": "user", "content": "Hi"}]


@dataclass
class CaseResult:
    name: str
    statuses: list[int] = field(default_factory=list)
    seconds: float = 0.0
    problem: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def pattern_properties(n: int) -> dict:
    return {"type": "object", "properties": {
        f"field_{i}": {"type": "string", "pattern": "^[a-z]{1,%d}$" % (50 + i)}
        for i in range(n)}}


def tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def _raw(route: str, body: bytes) -> Callable[[httpx.AsyncClient], Awaitable[list]]:
    async def send(client: httpx.AsyncClient) -> list:
        return [await client.post(route, content=body,
                                  headers={"Content-Type": "application/json"})]
    return send


def _post(route: str, body: dict) -> Callable[[httpx.AsyncClient], Awaitable[list]]:
    return _raw(route, json.dumps(body).encode())


def _chat(model: str, **fields: Any) -> Callable[[httpx.AsyncClient], Awaitable[list]]:
    return _post("/v1/chat/completions",
                 {"model": model, "messages": MESSAGES, "max_tokens": 4, **fields})


def _background_cancelled_together(model: str):
    async def send(client: httpx.AsyncClient) -> list:
        return await _cancel_background(client, model)
    return send


async def _cancel_background(client: httpx.AsyncClient, model: str) -> list:
    """40 background responses, then every one cancelled at once."""
    made = await asyncio.gather(*[client.post("/v1/responses", json={
        "model": model, "input": "Count to twenty.", "max_output_tokens": 64,
        "background": True, "store": True}) for _ in range(40)])
    ids = [r.json()["id"] for r in made if r.status_code == 200]
    cancelled = await asyncio.gather(*[client.post(f"/v1/responses/{rid}/cancel")
                                       for rid in ids])
    return [*made, *cancelled]


def _stored_big_metadata(model: str):
    async def send(client: httpx.AsyncClient) -> list:
        return await _big_metadata(client, model)
    return send


async def _big_metadata(client: httpx.AsyncClient, model: str) -> list:
    """Metadata of 5 MB (refused: OpenAI allows 16 short pairs), then legal metadata."""
    huge = {f"k{i}": "v" * (1 << 20) for i in range(5)}
    legal = {f"k{i}": "v" * 512 for i in range(16)}
    return [await client.post("/v1/responses", json={
        "model": model, "input": "Hi", "max_output_tokens": 2, "metadata": meta})
        for meta in (huge, legal)]


def cases(model: str) -> dict[str, Callable[[httpx.AsyncClient], Awaitable[list]]]:
    deep = b'{"prompt": ' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}"
    return {
        "invalid utf-8": _raw("/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}'),
        "lone surrogate": _raw("/v1/completions",
                               b'{"prompt": "\\ud800", "max_tokens": 2}'),
        "NaN temperature": _raw("/v1/completions",
                                b'{"prompt": "Hi", "max_tokens": 2, "temperature": NaN}'),
        "JSON nested a million deep": _raw("/v1/completions", deep),
        "20 MB prompt": _post("/v1/completions", {"model": model, "prompt": "a" * 20_000_000,
                                                  "max_tokens": 2}),
        "n=64": _post("/v1/completions", {"model": model, "prompt": "Hi", "n": 64,
                                          "max_tokens": 2}),
        "10k bad_words": _post("/v1/completions", {
            "model": model, "prompt": "Hi", "max_tokens": 2,
            "bad_words": [f"word{i}" for i in range(10_000)]}),
        "1 MB cache_salt": _post("/v1/completions", {"model": model, "prompt": "Hi",
                                                     "max_tokens": 2,
                                                     "cache_salt": "s" * (1 << 20)}),
        "10k prompts": _post("/v1/completions", {"model": model, "max_tokens": 1,
                                                 "prompt": ["Hi"] * 10_000}),
        "20k-property tool schema": _chat(model, tools=tool(pattern_properties(20_000)),
                                          tool_choice="required"),
        "1k slow patterns": _chat(model, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": pattern_properties(1000)}}),
        "100k-entry enum": _chat(model, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"enum": [f"v{i}" for i in range(100_000)]}}}),
        "schema nested 10k deep": _raw("/v1/chat/completions", _deep_schema_body(model,
                                                                                 10_000)),
        "5 MB of metadata": _stored_big_metadata(model),
        "unknown call_id": _post("/v1/responses", {"model": model, "input": [
            {"type": "function_call_output", "call_id": "call_nope", "output": "42"}]}),
        "40 background responses cancelled": _background_cancelled_together(model),
    }


def _deep_schema_body(model: str, levels: int) -> bytes:
    """A chat body whose response_format schema nests `levels` arrays (written as text:
    the json module itself cannot write it)."""
    schema = b'{"type": "array", "items": ' * levels + b"{}" + b"}" * levels
    head = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": 4})[:-1].encode()
    return (head + b', "response_format": {"type": "json_schema", "json_schema": '
            b'{"name": "x", "schema": ' + schema + b"}}}")


async def run_case(client: httpx.AsyncClient, name: str,
                   send: Callable[[httpx.AsyncClient], Awaitable[list]],
                   max_seconds: float) -> CaseResult:
    result = CaseResult(name)
    start = time.monotonic()
    try:
        responses = await asyncio.wait_for(send(client), max_seconds)
    except asyncio.TimeoutError:
        result.problem = f"no answer within {max_seconds:g} s"
        return result
    except httpx.HTTPError as e:
        result.problem = f"{type(e).__name__}: {e}"
        return result
    finally:
        result.seconds = time.monotonic() - start
    result.statuses = [r.status_code for r in responses]
    for r in responses:
        if r.status_code >= 500:
            result.problem = f"{r.status_code}: {r.text[:300]}"
        elif r.status_code >= 400 and "error" not in _json(r):
            result.problem = f"{r.status_code} without an error body: {r.text[:300]}"
    return result


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def server_alive(client: httpx.AsyncClient, model: str) -> Optional[str]:
    """None if /health and a plain completion work, else what failed."""
    try:
        health = await client.get("/health", timeout=10)
        done = await client.post("/v1/completions", json={"model": model, "prompt": "Hi",
                                                          "max_tokens": 2}, timeout=60)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    if health.status_code != 200 or done.status_code != 200:
        return f"/health {health.status_code}, completion {done.status_code}"
    return None


async def run_battery(url: str, api_key: Optional[str] = None,
                      max_seconds: float = 30.0) -> tuple[list[CaseResult], Optional[str]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=max_seconds + 30,
                                 limits=httpx.Limits(max_connections=64)) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        results = [await run_case(client, name, send, max_seconds)
                   for name, send in cases(model).items()]
        return results, await server_alive(client, model)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    args = parser.parse_args()
    if not httpx.URL(args.url).host in ("127.0.0.1", "localhost", "::1"):
        parser.error("the battery only targets a server on this machine (loopback).")
    results, dead = asyncio.run(run_battery(args.url, args.api_key, args.max_seconds))
    for r in results:
        print(f"{'ok ' if r.ok else 'BAD'} {r.name:36s} {r.seconds:6.2f} s {r.statuses}"
              f"{'  ' + r.problem if r.problem else ''}")
    print("server alive" if dead is None else f"server NOT alive: {dead}")
    return 0 if dead is None and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
