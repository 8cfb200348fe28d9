"""Command-line flags of the OpenAI server: server options plus every EngineArgs flag.

Names and defaults follow `vllm serve`; `vllm serve MODEL` and
`python -m vllm.entrypoints.openai.api_server --model MODEL` share this parser.
"""
from __future__ import annotations

import argparse
import json

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser


def _json_list(value: str) -> list[str]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON list such as '[\"*\"]': {e}")
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise argparse.ArgumentTypeError("expected a JSON list of strings such as '[\"*\"]'")
    return parsed


def _lora_module(value: str) -> "LoRAModulePath":
    """One --lora-modules item: 'name=path' or '{"name": .., "path": .., "base_model_name": ..}'."""
    from vllm.entrypoints.openai.serving_models import LoRAModulePath
    if value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"invalid JSON in --lora-modules {value!r}: {e}")
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) \
                or not isinstance(data.get("path"), str) \
                or set(data) - {"name", "path", "base_model_name"}:
            raise argparse.ArgumentTypeError(
                f"--lora-modules {value!r}: expected an object with string keys 'name' and "
                "'path', and optionally 'base_model_name'.")
        return LoRAModulePath(data["name"], data["path"], data.get("base_model_name"))
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"--lora-modules {value!r}: expected 'name=path' or a JSON object.")
    return LoRAModulePath(name, path)


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def _add(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup, flag: str,
         **kwargs) -> None:
    """Add a flag unless EngineArgs already defines it (one definition per flag)."""
    if flag not in parser._option_string_actions:  # noqa: SLF001 - argparse has no public API
        group.add_argument(flag, **kwargs)


def make_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Return `parser` (or a new one) with the server's and the engine's flags."""
    if parser is None:
        parser = FlexibleArgumentParser(
            description="vLLM OpenAI-compatible RESTful API server.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    server = parser.add_argument_group("Server arguments")
    server.add_argument("--config", type=str, default=None,
                        help="YAML file of flags (e.g. 'max-model-len: 4k'); flags given on "
                             "the command line take precedence.")
    server.add_argument("--host", type=str, default=None,
                        help="Host name to listen on; all interfaces when unset.")
    server.add_argument("--port", type=_port, default=8000, help="Port to listen on.")
    server.add_argument("--uvicorn-log-level", type=str, default="info",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="Log level of uvicorn.")
    server.add_argument("--disable-uvicorn-access-log", action="store_true",
                        help="Do not log every HTTP request (uvicorn access log).")
    server.add_argument("--allow-credentials", action="store_true",
                        help="CORS: allow credentials.")
    server.add_argument("--allowed-origins", type=_json_list, default=[],
                        help="CORS: origins whose browser pages may call the server, as a "
                             "JSON list (e.g. '[\"http://localhost:3000\"]', or '[\"*\"]' "
                             "for any). Default: none.")
    server.add_argument("--allowed-methods", type=_json_list, default=["*"],
                        help="CORS: allowed methods, as a JSON list.")
    server.add_argument("--allowed-headers", type=_json_list, default=["*"],
                        help="CORS: allowed headers, as a JSON list.")
    server.add_argument("--api-key", type=str, nargs="+", default=None,
                        help="If set, requests under /v1 must send 'Authorization: Bearer "
                             "<key>' with one of these keys. Defaults to the VLLM_API_KEY "
                             "environment variable.")
    server.add_argument("--chat-template", type=str, default=None,
                        help="Chat template: a file path or the Jinja template itself. "
                             "Defaults to the tokenizer's.")
    server.add_argument("--chat-template-content-format", type=str, default="auto",
                        choices=["auto", "string", "openai"],
                        help="How message content reaches the chat template: 'string' "
                             "joins text parts into one string, 'openai' passes the list "
                             "of parts, 'auto' picks 'openai' for templates that loop over "
                             "a message's content.")
    server.add_argument("--trust-request-chat-template", action="store_true",
                        help="Accept a chat_template passed in a request (rendered in a "
                             "sandbox with a time limit). Without it such requests are "
                             "refused.")
    server.add_argument("--response-role", type=str, default="assistant",
                        help="Role of generated chat messages when add_generation_prompt "
                             "is true.")
    server.add_argument("--api-server-count", "-asc", type=int, default=None,
                        help="API server processes sharing the port (default 1; 0 with "
                             "--headless). Each talks to every engine core; use several "
                             "when tokenization, detokenization and streaming, not the "
                             "engine, are the bottleneck.")
    server.add_argument("--headless", action="store_true",
                        help="Run this node's engine cores (data parallel) or workers "
                             "(--nnodes) without an API server; they join the head node.")
    server.add_argument("--shutdown-timeout", type=float, default=0.0,
                        help="On SIGTERM/SIGINT, seconds requests in flight may take to finish "
                             "(new ones get 503) before the rest are aborted with an error. "
                             "0 aborts them at once.")
    server.add_argument("--ssl-keyfile", type=str, default=None, help="SSL key file.")
    server.add_argument("--ssl-certfile", type=str, default=None, help="SSL certificate file.")
    server.add_argument("--ssl-ca-certs", type=str, default=None, help="SSL CA certificates.")
    server.add_argument("--root-path", type=str, default=None,
                        help="FastAPI root_path when the server runs behind a path-based "
                             "proxy.")
    server.add_argument("--return-tokens-as-token-ids", action="store_true",
                        help="Show logprob tokens as 'token_id:<id>' instead of text.")
    server.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help="Report usage.prompt_tokens_details.cached_tokens (prompt tokens "
                             "served from the prefix cache).")
    server.add_argument("--fingerprint-mode", type=str, default="full",
                        choices=["full", "hash", "custom", "none"],
                        help="The system_fingerprint of responses: 'full' "
                             "vllm-<version>[-<parallelism>]-<hash8> (an 8-digit hash of "
                             "the settings that change outputs), 'hash' without the "
                             "parallelism, 'custom' the --fingerprint-value, 'none' null.")
    server.add_argument("--fingerprint-value", type=str, default=None,
                        help="The system_fingerprint with --fingerprint-mode custom.")
    server.add_argument("--log-level", type=str, default=None,
                        choices=["debug", "info", "warning", "error", "critical"],
                        help="Level of the vllm loggers (default: VLLM_LOGGING_LEVEL).")
    server.add_argument("--disable-fastapi-docs", action="store_true",
                        help="Do not serve FastAPI's OpenAPI schema and its /docs and /redoc "
                             "pages.")
    server.add_argument("--enable-request-id-headers", action="store_true",
                        help="Answer each request with an X-Request-Id header: the one the "
                             "client sent, or a new one.")
    server.add_argument("--enable-force-include-usage", action="store_true",
                        help="Report usage in the last chunk of every streamed completion, "
                             "as if stream_options.include_usage were set.")
    server.add_argument("--enable-server-load-tracking", action="store_true",
                        help="Count the requests in flight on the model routes, which GET "
                             "/load reports (0 without this flag).")
    server.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                        help="Enable the /tokenizer_info endpoint. May expose chat "
                             "templates and other tokenizer configuration.")
    server.add_argument("--lora-modules", type=_lora_module, nargs="+", default=None,
                        help="LoRA adapters to serve, each 'name=path' or a JSON object "
                             '\'{"name": ..., "path": ..., "base_model_name": ...}\'; a request '
                             "selects one by naming it as its model. Needs --enable-lora.")
    server.add_argument("--max-log-len", type=int, default=None,
                        help="Most prompt characters/ids printed in request logs "
                             "(default: unlimited).")
    from vllm.entrypoints.openai.tool_parsers import ToolParserManager
    server.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='Let the model call tools on its own (tool_choice "auto"); '
                             "needs --tool-call-parser.")
    server.add_argument("--tool-call-parser", type=str, default=None,
                        help="How the model writes tool calls, to read them from its text "
                             'with tool_choice "auto": one of '
                             f"{', '.join(ToolParserManager.names())}, or a name registered "
                             "by --tool-parser-plugin.")
    server.add_argument("--default-chat-template-kwargs", type=_json_object, default=None,
                        help="Chat template kwargs as a JSON object (e.g. "
                             "'{\"enable_thinking\": false}'), used for every request; a "
                             "request's own chat_template_kwargs override them key by key.")
    server.add_argument("--tool-strict-level", type=str, default="auto",
                        choices=["auto", "function", "parameter"],
                        help='Server-side floor for tool calls under tool_choice "auto" '
                             "(structural tags, xgrammar): auto (only when a tool is "
                             "strict), function (every call held to one of the request's "
                             "functions; arguments to the schema only for strict tools), "
                             "parameter (also every tool's arguments to its schema, as if "
                             "each were strict).")
    server.add_argument("--tool-parser-plugin", type=str, default="",
                        help="A Python file that registers a tool parser with "
                             '@ToolParserManager.register_module("name") (from '
                             "vllm.tool_parsers); its name is then a --tool-call-parser.")
    AsyncEngineArgs.add_cli_args(parser)
    _add(parser, server, "--disable-log-requests", action="store_true",
         help="Do not log each received request.")
    _add(parser, server, "--enable-log-requests", action="store_true",
         help="Log each received request (vLLM's current spelling; requests are logged "
              "unless --disable-log-requests).")
    _add(parser, server, "--enable-log-outputs", action="store_true",
         help="Log each finished request's output text, token ids and finish reason.")
    _add(parser, server, "--disable-log-stats", action="store_true",
         help="Do not log throughput and cache statistics periodically.")
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """Fail fast, before loading the model, on flags that cannot work."""
    from vllm.entrypoints.openai.chat_utils import load_chat_template
    load_chat_template(args.chat_template)
    if getattr(args, "enable_auto_tool_choice", False) and not getattr(
            args, "tool_call_parser", None):
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser.")
    _check_tool_parser(args)
    _check_reasoning_parser(args)
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile must be given together.")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}.")
    if args.lora_modules and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora.")
    if getattr(args, "skip_tokenizer_init", False):
        raise ValueError("--skip-tokenizer-init: this server needs the tokenizer (text "
                         "prompts, chat templates, text output); the offline LLM takes "
                         "skip_tokenizer_init=True (token ids in, token ids out).")
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"--max-log-len must be >= 0, got {args.max_log_len}.")
    _check_deployment(args)


def needs_own_cores(args: argparse.Namespace) -> bool:
    """Whether this `vllm serve` needs engine cores of its own (it then runs through
    vllm/entrypoints/multi_server.py)."""
    if getattr(args, "headless", False) and getattr(args, "nnodes", 1) in (None, 1):
        return True
    dp = getattr(args, "data_parallel_size", 1)
    local = getattr(args, "data_parallel_size_local", None)
    return ((getattr(args, "api_server_count", None) or 1) > 1
            or (local is not None and local < dp)
            or (dp > 1 and getattr(args, "data_parallel_backend", "mp") == "ray"))


def _runtime_lora_updating() -> bool:
    from vllm import envs
    return bool(envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING)


def _check_deployment(args: argparse.Namespace) -> None:
    """--api-server-count / --headless against the data-parallel layout."""
    count = getattr(args, "api_server_count", None)
    if count is not None and count < 0:
        raise ValueError(f"--api-server-count must be >= 0, got {count}.")
    if getattr(args, "headless", False):
        if count:
            raise ValueError(f"--api-server-count={count} cannot be used with --headless "
                             "(no API server runs on a headless node).")
    elif count == 0:
        raise ValueError("--api-server-count=0 starts no API server: use --headless.")
    elif count is not None and count > 1 and _runtime_lora_updating():
        raise ValueError(f"VLLM_ALLOW_RUNTIME_LORA_UPDATING with --api-server-count={count}: "
                         "an adapter loaded through one API server would be unknown to the "
                         "others. Give the adapters with --lora-modules, or run one API "
                         "server.")
    elif getattr(args, "data_parallel_start_rank", 0):
        raise ValueError("--data-parallel-start-rank is for a --headless node (the head "
                         "node runs ranks from 0); hybrid load balancing, API servers on "
                         "every node, is not supported.")


def _check_tool_parser(args: argparse.Namespace) -> None:
    """Load --tool-parser-plugin, then check --tool-call-parser names a parser."""
    from vllm.entrypoints.openai.tool_parsers import ToolParserManager
    if getattr(args, "tool_parser_plugin", ""):
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    name = getattr(args, "tool_call_parser", None)
    if name and name not in ToolParserManager.list_registered():
        raise ValueError(f"--tool-call-parser {name!r} is not known; choose one of "
                         f"{', '.join(ToolParserManager.list_registered())} (or register it "
                         "with --tool-parser-plugin).")


def _check_reasoning_parser(args: argparse.Namespace) -> None:
    """Load --reasoning-parser-plugin, then check --reasoning-parser names a parser."""
    from vllm.reasoning import ReasoningParserManager
    if getattr(args, "reasoning_parser_plugin", ""):
        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
    name = getattr(args, "reasoning_parser", None)
    if name:
        ReasoningParserManager.check_name(name)


def _json_object(value: str) -> dict:
    """A flag's JSON object value (argparse reports the ValueError as a usage error)."""
    import json
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError(f"expected a JSON object, got {value!r}")
    return parsed
