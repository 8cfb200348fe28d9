"""The generated docs pages equal what scripts/gen_docs_reference.py writes now: the CLI
reference (the argument parsers), the environment variables (vllm/envs.py) and the
supported architectures (the model registry) cannot drift from the code."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_generated_pages_are_current():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_docs_reference.py"),
                           "--check"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_serve_flag_and_variable_is_documented():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import gen_docs_reference as gen
    finally:
        sys.path.pop(0)
    from vllm import envs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    cli, env = gen.cli_page(), gen.env_page()
    for action in make_arg_parser()._actions:  # noqa: SLF001
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        for flag in action.option_strings:
            assert f"`{flag}`" in cli, flag
    for name in envs.environment_variables:
        assert f"`{name}`" in env, name
