"""`vllm bench serve|throughput|latency`: vLLM's benchmark sub-commands.

Each is the benchmark of vllm/benchmarks/ with its own flags (vLLM's names): `serve`
streams requests to a running OpenAI-compatible server, `throughput` and `latency`
run the engine offline.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHMARKS = {
    "serve": "Benchmark the online serving throughput and latency of a running server.",
    "throughput": "Benchmark offline inference throughput.",
    "latency": "Benchmark the latency of processing a single batch of requests.",
}


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    bench = subparsers.add_parser("bench", help="vLLM's benchmarks (serve, throughput, "
                                  "latency).", description="Run a vLLM benchmark.",
                                  usage="vllm bench {serve,throughput,latency} [options]")
    kinds = bench.add_subparsers(dest="bench_type", metavar="{serve,throughput,latency}")
    for name, description in BENCHMARKS.items():
        parser = kinds.add_parser(name, help=description, description=description,
                                  usage=f"vllm bench {name} [options]")
        _module(name).add_cli_args(parser)
        parser.set_defaults(dispatch_function=_run(name))
    bench.set_defaults(dispatch_function=lambda _args: bench.print_help())
    return bench


def _module(name: str) -> Any:
    return importlib.import_module(f"vllm.benchmarks.{name}")


def _run(name: str) -> Any:
    def run(args: argparse.Namespace) -> None:
        _module(name).main(args)
    return run
