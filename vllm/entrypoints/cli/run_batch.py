"""`vllm run-batch -i INPUT -o OUTPUT [engine flags]`: an OpenAI batch file, run offline."""
from __future__ import annotations

import argparse
from typing import Any


def add_run_batch_parser(subparsers: Any) -> argparse.ArgumentParser:
    from vllm.entrypoints.openai.run_batch import make_parser
    parser = subparsers.add_parser(
        "run-batch", help="Run an OpenAI batch file (JSON lines) through the engine.",
        description="Run batch prompts and write the results to a file.",
        usage="vllm run-batch -i INPUT.jsonl -o OUTPUT.jsonl [options]")
    make_parser(parser)
    parser.set_defaults(dispatch_function=cmd_run_batch)
    return parser


def cmd_run_batch(args: argparse.Namespace) -> None:
    from vllm.entrypoints.openai.run_batch import main
    main(args)
