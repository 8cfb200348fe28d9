"""A proxy for prefill/decode disaggregated serving (as vLLM's disaggregated-serving
example): each request goes to a prefill instance with max_tokens=1, then, with the
`kv_transfer_params` of its answer, to a decode instance, whose answer (streamed or
not) is the client's.

Start a prefill and a decode instance (same model, same parallel layout), then the
proxy:

    vllm serve MODEL --port 8100 --kv-transfer-config \\
        '{"kv_connector": "P2pZmqConnector", "kv_role": "kv_producer", "kv_port": 14579}'
    vllm serve MODEL --port 8200 --kv-transfer-config \\
        '{"kv_connector": "P2pZmqConnector", "kv_role": "kv_consumer"}'
    python examples/disagg_proxy_server.py --prefill http://127.0.0.1:8100 \\
        --decode http://127.0.0.1:8200 --port 8000

Several --prefill / --decode URLs are used in turn (round robin). The client's
Authorization header is passed on to both instances.
"""
from __future__ import annotations

import argparse
import itertools
import logging
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

logger = logging.getLogger("vllm.disagg_proxy")

ONE_TOKEN_FIELDS = {"max_tokens": 1, "stream": False, "min_tokens": 0}
"""What the prefill leg of a request overrides: it only computes the prompt's KV."""
CHAT = "/v1/chat/completions"
DROPPED_FIELDS = ("stream_options", "n", "best_of")


def _error(status: int, message: str) -> JSONResponse:
    kind = "BadGatewayError" if status == 502 else "InternalServerError"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": status}}, status_code=status)


def build_app(prefill_urls: list[str], decode_urls: list[str],
              timeout_s: float = 600.0) -> FastAPI:
    app = FastAPI()
    prefills = itertools.cycle(prefill_urls)
    decodes = itertools.cycle(decode_urls)
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))

    def headers_of(request: Request) -> dict[str, str]:
        auth = request.headers.get("authorization")
        return {"Authorization": auth} if auth else {}

    async def prefill(path: str, body: dict[str, Any], headers: dict[str, str]
                      ) -> tuple[Any, JSONResponse | None]:
        """(the prefill answer's kv_transfer_params, or the error to return)."""
        leg = {k: v for k, v in body.items() if k not in DROPPED_FIELDS}
        leg.update(ONE_TOKEN_FIELDS)
        if path == CHAT:
            leg["max_completion_tokens"] = 1
        leg["kv_transfer_params"] = {"do_remote_decode": True}
        url = next(prefills)
        try:
            resp = await client.post(url + path, json=leg, headers=headers)
        except httpx.HTTPError as e:
            return None, _error(502, f"prefill instance {url} unreachable: {e}")
        if resp.status_code != 200:
            return None, JSONResponse(resp.json(), status_code=resp.status_code)
        return resp.json().get("kv_transfer_params"), None

    async def forward(path: str, request: Request):
        body = await request.json()
        headers = headers_of(request)
        kv_params, error = await prefill(path, body, headers)
        if error is not None:
            return error
        body = dict(body, kv_transfer_params=kv_params)
        url = next(decodes)
        if not body.get("stream"):
            try:
                resp = await client.post(url + path, json=body, headers=headers)
            except httpx.HTTPError as e:
                return _error(502, f"decode instance {url} unreachable: {e}")
            return JSONResponse(resp.json(), status_code=resp.status_code)
        req = client.build_request("POST", url + path, json=body, headers=headers)
        try:
            resp = await client.send(req, stream=True)
        except httpx.HTTPError as e:
            return _error(502, f"decode instance {url} unreachable: {e}")

        async def relay():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()

        return StreamingResponse(relay(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type"))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await forward("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await forward("/v1/chat/completions", request)

    @app.get("/health")
    async def health():
        for url in prefill_urls + decode_urls:
            try:
                if (await client.get(url + "/health")).status_code != 200:
                    return _error(503, f"{url} is not healthy")
            except httpx.HTTPError:
                return _error(503, f"{url} is unreachable")
        return JSONResponse({})

    @app.get("/v1/models")
    async def models(request: Request):
        resp = await client.get(decode_urls[0] + "/v1/models", headers=headers_of(request))
        return JSONResponse(resp.json(), status_code=resp.status_code)

    @app.on_event("shutdown")
    async def close_client():
        await client.aclose()

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill", nargs="+", required=True, help="prefill instance URLs")
    parser.add_argument("--decode", nargs="+", required=True, help="decode instance URLs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="longest wait for an instance's answer")
    args = parser.parse_args()
    app = build_app([u.rstrip("/") for u in args.prefill],
                    [u.rstrip("/") for u in args.decode], args.timeout_s)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
