"""Forking the server's engine core before the server imports its web stack.

Why: the engine core is forked once the server's flags are known (core_launch.py), and
from then on it initializes in parallel with the server. The server's own module first
imports FastAPI, the request models and the routes (about a second on a small CPU),
none of which the core needs, so the fork comes before them:
`python -m vllm.entrypoints.openai.api_server` calls `prestart_from_argv` first thing,
and `vllm serve` calls `prestart` before it imports the server module. The server's
`run_server` then finds the core already started.

Nothing changes for bad flags: flags that do not parse or validate start no core here,
and the server parses and validates them again and reports the error as before.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Optional


def prestart(args: argparse.Namespace) -> bool:
    """Fork the engine core for the server `args` describe (valid flags, one engine, the
    core in its own process, fork safe here); True if one was started."""
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    try:
        validate_parsed_serve_args(args)
    except Exception:  # noqa: BLE001 - the server reports it when it validates them
        return False
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_engine import prestart_engine_core
    return prestart_engine_core(getattr(args, "data_parallel_size", 1),
                                AsyncEngineArgs.from_cli_args(args))


def prestart_from_argv(argv: Optional[list[str]] = None) -> bool:
    """`prestart` for the flags in `argv` (default: this process's), parsed silently:
    flags that do not parse, or --help, start nothing (the server prints them)."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            args = make_arg_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit:
        return False
    return prestart(args)
