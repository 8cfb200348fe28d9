"""vLLM 0.32's import path for the server's command-line parser.

The parser lives in `vllm.entrypoints.openai.cli_args` (shared by `vllm serve` and
`python -m vllm.entrypoints.openai.api_server`); this module re-exports it so code
written against vLLM 0.32 builds the same parser.
"""
from vllm.entrypoints.openai.cli_args import (  # noqa: F401 - re-exports
    make_arg_parser, validate_parsed_serve_args)

__all__ = ["make_arg_parser", "validate_parsed_serve_args"]
