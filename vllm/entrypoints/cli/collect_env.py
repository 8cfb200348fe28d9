"""`vllm collect-env`: print the environment report of vllm/collect_env.py."""
from __future__ import annotations

import argparse
from typing import Any


def add_collect_env_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "collect-env", help="Print the machine, software and settings (for bug reports).",
        description="Collect and print environment information.",
        usage="vllm collect-env")
    parser.set_defaults(dispatch_function=cmd_collect_env)
    return parser


def cmd_collect_env(_args: argparse.Namespace) -> None:
    from vllm.collect_env import main
    main()
