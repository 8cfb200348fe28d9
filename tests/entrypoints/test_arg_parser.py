"""`vllm serve` flags as vLLM's parser takes them: short -tp/-pp/-dp, underscore spellings,
k/K/m/M sizes, --config YAML (command line wins), --hf-overrides JSON, --tokenizer-mode."""
from __future__ import annotations

import argparse

import pytest

from vllm.entrypoints.cli.main import make_parser
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import human_readable_int


@pytest.mark.parametrize("text,value", [("4096", 4096), ("4k", 4000), ("4K", 4096),
                                        ("25.6k", 25600), ("1m", 1_000_000),
                                        ("2M", 2 * 1024 * 1024), ("1g", 10 ** 9)])
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["4x", "1.5K", "k", "-3", "1.5", "0.0001k"])
def test_human_readable_int_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int(text)


def test_short_and_underscore_flags():
    args = make_parser().parse_args(["serve", "m", "-tp", "2", "-pp", "2", "-dp", "1",
                                     "--max_model_len=8k", "--max_num_seqs", "3",
                                     "--enable_prefix_caching", "--tokenizer_mode", "slow",
                                     "--hf-overrides", '{"rope_theta": 5.0}'])
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (2, 2)
    assert (args.max_model_len, args.max_num_seqs, args.tokenizer_mode) == (8000, 3, "slow")
    assert args.enable_prefix_caching is True and args.hf_overrides == {"rope_theta": 5.0}


def test_bad_values_are_refused(capsys):
    parser = make_arg_parser()
    for bad in (["--tokenizer-mode", "custom"], ["--max-model-len", "4q"],
                ["--hf-overrides", "[1]"], ["--config"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_config_file_then_command_line(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("model: acme/tiny\nmax-model-len: 4K\nenable_prefix_caching: false\n"
                      "tensor-parallel-size: 2\nserved-model-name: [a, b]\n"
                      "hf-overrides: {rope_theta: 5.0}\nport: 9001\n")
    args = make_arg_parser().parse_args(["--config", str(config), "-tp", "1"])
    assert args.model == "acme/tiny" and args.max_model_len == 4096
    assert args.enable_prefix_caching is False and args.tensor_parallel_size == 1
    assert args.served_model_name == ["a", "b"] and args.hf_overrides == {"rope_theta": 5.0}
    assert args.port == 9001
    serve = make_parser().parse_args(["serve", "local/model", f"--config={config}",
                                      "--port", "9002"])
    assert serve.model_tag == "local/model" and serve.port == 9002
    assert serve.max_model_len == 4096
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    with pytest.raises(SystemExit):
        make_arg_parser().parse_args(["--config", str(tmp_path / "bad.yaml")])


def test_help_of_a_field_several_configs_hold_is_the_flags_own():
    """--max-model-len and --download-dir are held by two configs each; the help is the
    one of the config the flag fills (it read "Copied from ModelConfig by VllmConfig."
    and "no downloads happen", while Hub ids do download)."""
    text = make_arg_parser(argparse.ArgumentParser()).format_help()
    flat = " ".join(text.split())
    assert "Copied from" not in flat
    assert "--max-model-len MAX_MODEL_LEN Context length (prompt + output)" in flat
    assert "--download-dir DOWNLOAD_DIR Cache directory for Hub models" in flat


def test_vllm_defaults_and_removed_flags(capsys):
    """vLLM's --gpu-memory-utilization default is 0.92 (CLI, EngineArgs, LLM); vLLM no
    longer has --swap-space (preemption recomputes): the flag and the LLM argument are
    refused, not silently ignored."""
    import inspect

    from vllm.config import CacheConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.llm import LLM
    assert make_arg_parser().parse_args([]).gpu_memory_utilization == 0.92
    assert EngineArgs().gpu_memory_utilization == CacheConfig().gpu_memory_utilization == 0.92
    assert inspect.signature(LLM).parameters["gpu_memory_utilization"].default == 0.92
    with pytest.raises(SystemExit):
        make_arg_parser().parse_args(["--swap-space", "4"])
    assert "--swap-space" in capsys.readouterr().err
    with pytest.raises(ValueError, match="swap_space"):
        LLM(model="unused", swap_space=4)


def test_server_refuses_skip_tokenizer_init_up_front():
    """The offline LLM takes skip_tokenizer_init; the server needs its tokenizer, so it
    says so before loading the model instead of failing inside start-up."""
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    args = make_arg_parser().parse_args(["--skip-tokenizer-init"])
    with pytest.raises(ValueError, match="--skip-tokenizer-init"):
        validate_parsed_serve_args(args)
