"""Strict tool calls on the served default model: how many sampled requests call the tool,
and how many of those calls' arguments validate against its schema (jsonschema).

Starts a server (`--enable-auto-tool-choice --tool-call-parser hermes`, the default
model unless --model) or uses --url, then sends --num-requests chat requests at
temperature 1 (seeds 0..N-1) offering one tool (one call per turn:
parallel_tool_calls false), for each case:

* `auto, strict`: tool_choice "auto", `strict: true` (arguments held to the schema by a
  structural tag once the model opens a call; the model may still answer in text);
* `auto, not strict`: the same without `strict` (what every request got before strict
  was read: the schema was never enforced under "auto");
* `required`: tool_choice "required" (the whole output is constrained to a call list).

    python benchmarks/strict_tool_calls.py --num-requests 20
    python benchmarks/strict_tool_calls.py --json      # one JSON object per case
    python benchmarks/strict_tool_calls.py --tool-strict-level parameter \
        --cases "auto, not strict"                     # the server-side floor

Prints, per case, requests / requests with a tool call / calls / calls whose arguments
validate.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Optional

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "minLength": 1},
                         "days": {"type": "integer", "minimum": 1, "maximum": 7},
                         "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "days", "unit"], "additionalProperties": False}
MESSAGES = [
    {"role": "system", "content": "You can call the tool get_forecast(city, days, unit). To "
     'call it, answer with <tool_call>{"name": "get_forecast", "arguments": {...}}'
     "</tool_call> and nothing else."},
    {"role": "user", "content": "Weather in London for two days, in fahrenheit?"},
    {"role": "assistant", "content": '<tool_call>{"name": "get_forecast", "arguments": '
     '{"city": "London", "days": 2, "unit": "fahrenheit"}}</tool_call>'},
    {"role": "user", "content": "What will the weather be in Paris for the next three days, "
     "in celsius?"}]
"""A one-shot example of the call format: the 135M default model does not call tools from
the tool list alone (its template does not render tools)."""
CASES = {"auto, strict": ("auto", True), "auto, not strict": ("auto", False),
         "required": ("required", True)}


def tool(strict: bool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": "get_forecast", "description": "Weather forecast of a city",
                          "parameters": SCHEMA}
    if strict:
        fn["strict"] = True
    return {"type": "function", "function": fn}


def measure(url: str, model: str, choice: str, strict: bool, n: int,
            max_tokens: int) -> dict[str, Any]:
    import httpx
    import jsonschema
    requests_with_calls = calls = valid = 0
    with httpx.Client(base_url=url, timeout=300) as http:
        for seed in range(n):
            body = {"model": model, "messages": MESSAGES, "tools": [tool(strict)],
                    "tool_choice": choice, "temperature": 1.0, "seed": seed,
                    "max_tokens": max_tokens, "parallel_tool_calls": False}
            r = http.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            made = r.json()["choices"][0]["message"].get("tool_calls") or []
            requests_with_calls += bool(made)
            for call in made:
                calls += 1
                try:
                    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)
                    valid += 1
                except (ValueError, jsonschema.ValidationError):
                    pass
    return {"requests": n, "requests_with_calls": requests_with_calls, "calls": calls,
            "valid_calls": valid}


def start_server(model: Optional[str], strict_level: str = "auto"
                 ) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--disable-log-requests", "--max-model-len", "2048",
           "--tool-strict-level", strict_level]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import httpx
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    raise RuntimeError("the server did not start within 600 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--tool-strict-level", default="auto",
                        choices=["auto", "function", "parameter"],
                        help="the started server's --tool-strict-level")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.model, args.tool_strict_level)
    try:
        import httpx
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        for name in args.cases:
            choice, strict = CASES[name]
            result = {"case": name, **measure(url, model, choice, strict, args.num_requests,
                                              args.max_tokens)}
            if args.json:
                print(json.dumps(result))
            else:
                print(f"{name:>17}: {result['requests']} requests, "
                      f"{result['requests_with_calls']} with a tool call, "
                      f"{result['valid_calls']}/{result['calls']} calls valid", flush=True)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
