"""`vllm serve ... --nnodes N --node-rank R --headless`: a node that runs only its
tensor/pipeline-parallel workers, for the engine of node 0 (vllm/executor/multinode.py).

(With --data-parallel-size above 1, --headless runs a node's data-parallel engine cores
instead: vllm/entrypoints/openai/multi_server.py.)
"""
from __future__ import annotations

import argparse
import logging
import sys

logger = logging.getLogger(__name__)


def is_headless_worker_node(args: argparse.Namespace) -> bool:
    return (bool(getattr(args, "headless", False)) and (getattr(args, "nnodes", 1) or 1) > 1
            and (getattr(args, "data_parallel_size", 1) or 1) == 1)


def run_headless_workers_if_asked(args: argparse.Namespace) -> None:
    """Run this node's workers and exit with their status when the flags ask for a
    headless worker node; otherwise return."""
    if not is_headless_worker_node(args):
        return
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.executor.multinode import run_headless
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    try:
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        code = run_headless(config)
    except (ValueError, OSError, TimeoutError, RuntimeError) as e:
        logger.error("%s", e)
        code = 1
    sys.exit(code)
