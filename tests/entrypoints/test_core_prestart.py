"""The server forks its engine core before importing its web stack
(vllm/entrypoints/openai/core_prestart.py), and only for flags that parse and validate:
bad flags start nothing, print nothing here, and fail later with the server's own
message, once."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm.engine import core_launch
from vllm.entrypoints.openai import core_prestart

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_fork(monkeypatch):
    """Record what would be forked instead of forking."""
    started = []
    monkeypatch.setattr(core_launch, "prestart", lambda engine_args=None: started.append(
        engine_args) or True)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    return started


@pytest.mark.parametrize("argv", [["--max-model-len", "many"], ["--no-such-flag"],
                                  ["--help"], ["--enable-auto-tool-choice"],
                                  ["--ssl-keyfile", "k.pem"]])
def test_flags_that_do_not_parse_or_validate_start_no_core_and_print_nothing(
        argv, no_fork, capsys):
    assert core_prestart.prestart_from_argv(argv) is False
    assert no_fork == []
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_valid_flags_fork_with_the_servers_engine_arguments(no_fork):
    assert core_prestart.prestart_from_argv(["--max-model-len", "300", "--seed", "7"])
    (engine_args,) = no_fork
    assert (engine_args.max_model_len, engine_args.seed) == (300, 7)


def test_no_early_core_for_data_parallel_or_an_in_process_core(no_fork, monkeypatch):
    assert not core_prestart.prestart_from_argv(["--data-parallel-size", "2"])
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert not core_prestart.prestart_from_argv([])
    assert no_fork == []


def test_a_bad_flag_fails_the_server_once_with_argparses_message():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                          "--max-model-len", "many"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("error: argument --max-model-len") == 1, out.stderr


def test_the_flags_are_parsed_and_checked_without_the_request_models():
    """What runs before the fork stays off the OpenAI request models (pydantic, ~0.4 s
    of every start's critical path): the tool parsers and errors import them lazily."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import sys\n"
            "from vllm.entrypoints.openai import cli_args\n"
            "args = cli_args.make_arg_parser().parse_args(\n"
            "    ['--tool-call-parser', 'hermes', '--enable-auto-tool-choice'])\n"
            "cli_args.validate_parsed_serve_args(args)\n"
            "print(sorted(m for m in ('pydantic', 'vllm.entrypoints.openai.protocol')\n"
            "             if m in sys.modules))\n"
            "from vllm.entrypoints.openai.tool_parsers import ToolParserManager\n"
            "parser = ToolParserManager.get_tool_parser(args.tool_call_parser)\n"
            "print(parser.__name__, 'vllm.entrypoints.openai.protocol' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "Hermes2ProToolParser True"]
