"""`vllm serve [MODEL] [flags]`: start the OpenAI-compatible server."""
from __future__ import annotations

import argparse
from typing import Any


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    parser = subparsers.add_parser(
        "serve", help="Start the vLLM OpenAI-compatible API server.",
        description="Start the vLLM OpenAI-compatible API server.",
        usage="vllm serve [model_tag] [options]",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("model_tag", type=str, nargs="?", default=None,
                        help="The model to serve (overrides --model).")
    make_arg_parser(parser)
    parser.set_defaults(dispatch_function=cmd_serve)
    return parser


def resolve_model_tag(args: argparse.Namespace) -> argparse.Namespace:
    """The positional MODEL wins over --model, as in vLLM."""
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    return args


def cmd_serve(args: argparse.Namespace) -> None:
    from vllm.entrypoints.openai.core_prestart import prestart
    args = resolve_model_tag(args)
    from vllm.entrypoints.cli.headless import run_headless_workers_if_asked
    run_headless_workers_if_asked(args)  # --nnodes N --headless: this node's workers only
    from vllm.entrypoints.multi_server import run_multi_server
    run_multi_server(args)  # returns unless the deployment needs cores of its own
    prestart(args)  # the engine core starts before the server module's imports
    from vllm.entrypoints.openai.api_server import run_server
    run_server(args)
