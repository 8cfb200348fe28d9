"""benchmark_startup.py: its flags, and one timed start of a stand-in server (a static
file server whose `/health` answers 200), alternating between two checkouts."""
from __future__ import annotations

import shlex

import pytest

from benchmarks.benchmark_startup import (REPO_ROOT, byte_compile, main, parse_args,
                                          server_command)


def test_flags_and_server_args_after_the_separator(tmp_path):
    args = parse_args(["--runs", "2", "--first-start", "--checkout", str(tmp_path), "--",
                       "--max-model-len", "512"])
    assert args.runs == 2 and args.first_start and args.checkout == [str(tmp_path)]
    assert args.server_args == ["--max-model-len", "512"]
    assert parse_args([]).checkout == [REPO_ROOT]
    cmd = server_command(args.command, 1234, args.server_args)
    assert cmd[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--port", "1234",
                       "--max-model-len", "512"]
    with pytest.raises(SystemExit):
        parse_args(["--runs", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--max-model-len", "512"])  # a server flag without `--`
    with pytest.raises(SystemExit):
        parse_args(["--checkout", str(tmp_path / "missing")])


def test_times_a_server_until_health_answers(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    (site / "health").write_text("ok")
    other = tmp_path / "other"
    other.mkdir()
    command = ("{python} -m http.server {port} --bind 127.0.0.1 --directory "
               + shlex.quote(str(site)))
    results = main(["--runs", "2", "--no-compile", "--command", command, "--checkout", REPO_ROOT,
                    "--checkout", str(other), "--timeout", "60"])
    assert [r.checkout for r in results] == [REPO_ROOT, str(other)] * 2  # alternating
    assert all(r.ready_s > 0 and r.cpu_s > 0 and r.request_s is None for r in results)
    out = capsys.readouterr().out
    assert out.startswith("CPU: ") and f"{other}: ready median" in out


def test_a_server_that_exits_is_reported_with_its_output(tmp_path):
    command = "{python} -c 'print(\"no model here\"); raise SystemExit(3)' {port}"
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 3.*no model here"):
        main(["--runs", "1", "--command", command, "--timeout", "60"])


def test_checkouts_are_byte_compiled_like_an_installed_package(tmp_path):
    """With PYTHONDONTWRITEBYTECODE set a checkout would compile its modules at every start."""
    package = tmp_path / "vllm" / "sub"
    package.mkdir(parents=True)
    (package / "mod.py").write_text("X = 1\n")
    assert byte_compile(str(tmp_path))
    assert list((package / "__pycache__").glob("mod.*.pyc"))
    (package / "bad.py").write_text("def broken(:\n")
    assert not byte_compile(str(tmp_path))
    assert byte_compile(str(tmp_path / "no-package-here"))
