"""`vllm serve` argument parsing, and app wiring (auth from env, CORS) over a fake engine."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from tests.entrypoints.fake_engine import FakeLLMEngine
from vllm.engine.async_llm_engine import AsyncLLMEngine


def parse_serve(argv: list[str]):
    from vllm.entrypoints.cli.main import make_parser
    from vllm.entrypoints.cli.serve import resolve_model_tag
    return resolve_model_tag(make_parser().parse_args(["serve", *argv]))


def test_serve_flags():
    args = parse_serve(["/models/x", "--model", "ignored", "--port", "9001", "--host",
                        "127.0.0.1", "--max-num-seqs", "3", "--served-model-name", "a", "b",
                        "--api-key", "k", "--response-role", "bot", "--max-log-len", "7",
                        "--allowed-origins", '["http://a"]', "--no-enable-prefix-caching",
                        "--disable-log-requests", "--disable-log-stats"])
    assert args.model == "/models/x" and args.port == 9001 and args.host == "127.0.0.1"
    assert args.max_num_seqs == 3 and args.served_model_name == ["a", "b"]
    assert args.api_key == ["k"] and args.response_role == "bot" and args.max_log_len == 7
    assert args.allowed_origins == ["http://a"] and args.enable_prefix_caching is False
    assert args.disable_log_requests and args.disable_log_stats
    from vllm.engine.arg_utils import AsyncEngineArgs
    engine_args = AsyncEngineArgs.from_cli_args(args)
    assert engine_args.model == "/models/x" and engine_args.disable_log_requests
    defaults = parse_serve([])
    assert defaults.port == 8000 and defaults.response_role == "assistant"
    assert defaults.api_key is None and defaults.allowed_origins == []
    with pytest.raises(SystemExit):
        parse_serve(["--port", "70000"])


def test_help_lists_vllm_flags():
    out = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--model", "--served-model-name", "--tensor-parallel-size",
                 "--max-model-len", "--gpu-memory-utilization", "--enable-prefix-caching",
                 "--max-num-seqs", "--host", "--port", "--api-key", "--chat-template",
                 "--response-role", "--allowed-origins", "--root-path", "--ssl-keyfile",
                 "--uvicorn-log-level", "--disable-log-requests", "--max-log-len",
                 "--shutdown-timeout", "--trust-request-chat-template"):
        assert flag in out.stdout, flag


def test_chat_template_flag(tmp_path):
    from vllm.entrypoints.openai.chat_utils import load_chat_template
    inline = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert load_chat_template(inline) == inline
    path = tmp_path / "t.jinja"
    path.write_text(inline)
    assert load_chat_template(str(path)) == inline
    with pytest.raises(ValueError, match="chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))


def run_app(tokenizer, argv: list[str], requests, start_loop: bool = False):
    """Build the app from CLI flags over a fake engine and run `requests(client)`
    (`start_loop`: start the engine loop first, as the app's lifespan would)."""
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    engine = AsyncLLMEngine(FakeLLMEngine(tokenizer), log_requests=False, log_stats=False)
    app = build_app(make_arg_parser().parse_args(argv), engine)

    async def main():
        if start_loop:
            engine.start_background_loop()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await requests(client)

    try:
        return asyncio.run(main())
    finally:
        engine.shutdown()


def test_api_key_from_env_and_open_routes(tokenizer, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "env-key")

    async def requests(client):
        denied = await client.get("/v1/models")
        allowed = await client.get("/v1/models", headers={"Authorization": "Bearer env-key"})
        health = await client.get("/health")
        tokenize = await client.post("/tokenize", json={"prompt": "hi"})
        return denied, allowed, health, tokenize

    denied, allowed, health, tokenize = run_app(tokenizer, [], requests)
    assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
    assert allowed.status_code == 200 and allowed.json()["data"][0]["id"] == "fake-model"
    assert health.status_code == 200 and tokenize.status_code == 200


def test_no_key_cors_and_chat_template_flag(tokenizer, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"

    async def requests(client):
        preflight = await client.options("/v1/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST"})
        chat = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
        tok = await client.post("/tokenize", json={
            "messages": [{"role": "user", "content": "hello"}]})
        return preflight, chat, tok

    preflight, chat, tok = run_app(
        tokenizer, ["--allowed-origins", '["http://ui.example"]', "--chat-template", template,
                    "--response-role", "bot"], requests)
    assert preflight.headers["access-control-allow-origin"] == "http://ui.example"
    body = chat.json()
    assert chat.status_code == 200 and body["choices"][0]["message"]["role"] == "bot"
    assert body["usage"]["completion_tokens"] == 3
    expected = tokenizer("[user] hello\n", add_special_tokens=False).input_ids
    assert tok.json()["tokens"] == expected
    assert body["usage"]["prompt_tokens"] == len(expected)


def test_shutdown_timeout_flag():
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    assert parse_serve([]).shutdown_timeout == 0  # vLLM's default: abort at once
    args = parse_serve(["--shutdown-timeout", "30", "--trust-request-chat-template"])
    assert args.shutdown_timeout == 30 and args.trust_request_chat_template
    with pytest.raises(ValueError, match="--shutdown-timeout"):
        validate_parsed_serve_args(parse_serve(["--shutdown-timeout", "-1"]))


@pytest.mark.parametrize("flag, expected", [
    ([], "<user>[a][b]"),  # auto: the template loops over the parts
    (["--chat-template-content-format", "string"], "<user>a\nb"),
    (["--chat-template-content-format", "openai"], "<user>[a][b]")])
def test_chat_template_content_format_flag(tokenizer, monkeypatch, flag, expected):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    template = ("{% for m in messages %}<{{ m.role }}>{% if m.content is string %}"
                "{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}"
                "{% endif %}{% endfor %}")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]

    async def requests(client):
        return await client.post("/tokenize", json={"messages": parts})

    tok = run_app(tokenizer, ["--chat-template", template, *flag], requests)
    assert tok.status_code == 200, tok.text
    assert tok.json()["tokens"] == tokenizer(expected, add_special_tokens=False).input_ids


def test_dotted_json_flags():
    """vLLM's key-by-key JSON flags: --hf-overrides.rope_theta 500000 and friends."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    args = make_arg_parser().parse_args([
        "--hf_overrides.rope_theta", "500000", "--hf-overrides.rope_scaling.type", "linear",
        "--limit-mm-per-prompt.image=0", "--max-model-len", "4k",
        "--override-generation-config", '{"temperature": 0.5, "top_k": 3}',
        "--override-generation-config.top_k", "5"])
    assert args.hf_overrides == {"rope_theta": 500000, "rope_scaling": {"type": "linear"}}
    assert args.limit_mm_per_prompt == {"image": 0}
    assert args.max_model_len == 4000
    assert args.override_generation_config == {"temperature": 0.5, "top_k": 5}


def test_tokenizer_info_endpoint_only_with_its_flag(tokenizer, monkeypatch):
    """vLLM's GET /tokenizer_info: off by default (404), and with
    --enable-tokenizer-info-endpoint the tokenizer's config as JSON: special tokens as
    text, no file paths, its class and the server's --chat-template."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"

    async def requests(client):
        return await client.get("/tokenizer_info")

    assert run_app(tokenizer, [], requests).status_code == 404
    info = run_app(tokenizer, ["--enable-tokenizer-info-endpoint", "--chat-template",
                               template], requests)
    assert info.status_code == 200, info.text
    body = info.json()
    assert body["tokenizer_class"] and body["chat_template"] == template
    assert body["eos_token"] == tokenizer.eos_token
    assert "vocab_file" not in body and "merges_file" not in body
