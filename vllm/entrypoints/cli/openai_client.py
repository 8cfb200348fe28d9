"""`vllm chat` and `vllm complete`: talk to a running server from the terminal, as vLLM's
CLI does (one message with `-q`, else a conversation read line by line from stdin until
end of input, so a script can be piped in).

Both use the official `openai` client against `--url` (default the local server) and
the server's first model unless `--model-name` names one.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Iterator

DEFAULT_URL = "http://localhost:8000/v1"


def add_client_parsers(subparsers: Any) -> None:
    chat = subparsers.add_parser(
        "chat", help="Chat with a running server (OpenAI chat completions).",
        description="Generate chat completions via the running API server.",
        usage="vllm chat [options]")
    _common_args(chat)
    chat.add_argument("--system-prompt", type=str, default=None,
                      help="A system message that starts the conversation.")
    chat.set_defaults(dispatch_function=cmd_chat)
    complete = subparsers.add_parser(
        "complete", help="Complete prompts with a running server (OpenAI completions).",
        description="Generate text completions via the running API server.",
        usage="vllm complete [options]")
    _common_args(complete)
    complete.set_defaults(dispatch_function=cmd_complete)


def _common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", type=str, default=DEFAULT_URL,
                        help="URL of the running OpenAI-compatible server (with /v1).")
    parser.add_argument("--model-name", type=str, default=None,
                        help="The model to use (default: the server's first model).")
    parser.add_argument("--api-key", type=str, default=None,
                        help="API key (default: the OPENAI_API_KEY environment variable, "
                             "else none).")
    parser.add_argument("-q", "--quick", type=str, default=None, metavar="MESSAGE",
                        help="Send one message, print the answer and exit.")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="Most tokens per answer (default: the server's).")


def _client(args: argparse.Namespace) -> tuple[Any, str]:
    """(openai client, model name)."""
    import openai
    try:  # api_key None: the client reads OPENAI_API_KEY
        client = openai.OpenAI(base_url=args.url, api_key=args.api_key)
    except openai.OpenAIError:  # no key anywhere: a server without --api-key needs none
        client = openai.OpenAI(base_url=args.url, api_key="EMPTY")
    model = args.model_name
    if model is None:
        models = client.models.list().data
        if not models:
            raise ValueError(f"The server at {args.url} lists no model.")
        model = models[0].id
    return client, model


def _inputs(args: argparse.Namespace, prompt: str) -> Iterator[str]:
    """The one quick message, else stdin's lines (a prompt shown when interactive)."""
    if args.quick is not None:
        yield args.quick
        return
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print(prompt, end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line.rstrip("\n")


def _print_stream(stream: Any, text_of: Any) -> str:
    parts = []
    for chunk in stream:
        if not chunk.choices:
            continue
        piece = text_of(chunk.choices[0]) or ""
        parts.append(piece)
        print(piece, end="", flush=True)
    print(flush=True)
    return "".join(parts)


def _server_errors(fn: Any) -> Any:
    """The client's errors (server gone, 4xx) as a ValueError: one line, exit status 1."""
    def run(args: argparse.Namespace) -> None:
        import openai
        try:
            fn(args)
        except openai.OpenAIError as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None
    return run


@_server_errors
def cmd_chat(args: argparse.Namespace) -> None:
    client, model = _client(args)
    messages: list[dict[str, str]] = []
    if args.system_prompt:
        messages.append({"role": "system", "content": args.system_prompt})
    for message in _inputs(args, "> "):
        messages.append({"role": "user", "content": message})
        stream = client.chat.completions.create(model=model, messages=messages, stream=True,
                                                **_max_tokens(args))
        answer = _print_stream(stream, lambda c: c.delta.content)
        messages.append({"role": "assistant", "content": answer})


@_server_errors
def cmd_complete(args: argparse.Namespace) -> None:
    client, model = _client(args)
    for prompt in _inputs(args, "> "):
        stream = client.completions.create(model=model, prompt=prompt, stream=True,
                                           **_max_tokens(args))
        _print_stream(stream, lambda c: c.text)


def _max_tokens(args: argparse.Namespace) -> dict[str, int]:
    return {} if args.max_tokens is None else {"max_tokens": args.max_tokens}
