"""The `vllm` command: `vllm serve MODEL ...`, `vllm chat`, `vllm complete`, `vllm bench`,
`vllm run-batch`, `vllm collect-env`, `vllm --version`.

Declared as the console script `vllm = vllm.entrypoints.cli.main:main`.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

logger = logging.getLogger("vllm.entrypoints.cli.main")  # not __main__ under -m


def make_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.benchmark import add_bench_parser
    from vllm.entrypoints.cli.collect_env import add_collect_env_parser
    from vllm.entrypoints.cli.openai_client import add_client_parsers
    from vllm.entrypoints.cli.run_batch import add_run_batch_parser
    from vllm.entrypoints.cli.serve import add_serve_parser
    from vllm.version import __version__
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=__version__)
    subparsers = parser.add_subparsers(
        dest="subcommand", metavar="{chat,complete,serve,bench,run-batch,collect-env}")
    add_client_parsers(subparsers)
    add_serve_parser(subparsers)
    add_bench_parser(subparsers)
    add_run_batch_parser(subparsers)
    add_collect_env_parser(subparsers)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    if getattr(args, "dispatch_function", None) is None:
        parser.print_help()
        sys.exit(2)
    try:
        args.dispatch_function(args)
    except KeyboardInterrupt:
        if args.subcommand == "serve":
            logger.info("Server stopped.")
    except (ValueError, OSError, MemoryError) as e:  # flags, port, KV cache: no traceback
        logger.error("%s", e)
        sys.exit(1)


if __name__ == "__main__":
    main()
