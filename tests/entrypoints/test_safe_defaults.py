"""Safe server defaults as vLLM: no CORS origin unless --allowed-origins, several API keys."""
from __future__ import annotations

import pytest

from tests.entrypoints.test_cli_and_app import run_app

PREFLIGHT = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))


def test_cors_allows_no_origin_by_default(tokenizer, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    async def requests(client):
        preflight = await client.options("/v1/completions", headers=PREFLIGHT)
        simple = await client.get("/v1/models", headers={"Origin": "http://evil.example"})
        return preflight, simple

    preflight, simple = run_app(tokenizer, [], requests)
    assert "access-control-allow-origin" not in preflight.headers
    assert preflight.status_code == 400
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers

    preflight, simple = run_app(tokenizer, ["--allowed-origins", '["*"]'], requests)
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert simple.headers["access-control-allow-origin"] == "*"


def test_several_api_keys(tokenizer, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "env-key")  # the flag wins over the variable

    async def requests(client):
        codes = []
        for key in ("first", "second", "env-key", "third", ""):
            r = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            codes.append(r.status_code)
        return codes

    assert run_app(tokenizer, ["--api-key", "first", "second"], requests) == \
        [200, 200, 401, 401, 401]
    assert run_app(tokenizer, [], requests) == [401, 401, 200, 401, 401]
