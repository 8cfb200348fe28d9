"""SpeculativeConfig parsing and refusals, the n-gram proposer, the acceptance stats."""
from __future__ import annotations

import argparse

import pytest

from vllm.spec_decode.config import SpeculativeConfig
from vllm.spec_decode.metrics import SpecDecodingStats
from vllm.spec_decode.ngram_proposer import NgramProposer


def test_config_defaults_and_vllm_field_names():
    c = SpeculativeConfig.from_cli('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.method, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 5, 5)
    c = SpeculativeConfig.from_cli({"num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert (c.method, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 4, 4)
    c = SpeculativeConfig.from_cli({"model": "/some/draft", "num_speculative_tokens": 4})
    assert c.method == "draft_model" and c.use_draft_model
    assert SpeculativeConfig.from_cli(None) is None


@pytest.mark.parametrize("value, field", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"num_speculative_tokens": 2, "bogus": 1}, "bogus"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
    ({"model": "/d", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     "draft_tensor_parallel_size"),
    ("not json", "JSON"),
])
def test_config_refusals_name_the_field(value, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig.from_cli(value)


def test_cli_flag_parses_json():
    from vllm.engine.arg_utils import EngineArgs
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--speculative-config",
                              '{"method": "ngram", "num_speculative_tokens": 2}'])
    assert EngineArgs.from_cli_args(args).speculative_config == {
        "method": "ngram", "num_speculative_tokens": 2}


def test_ngram_takes_the_longest_then_latest_match():
    p = NgramProposer(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
    # Suffix (1, 2, 3) occurred at 0 (followed by 9 8 7) and at 5 (followed by 4 5 6).
    tokens = [1, 2, 3, 9, 8, 1, 2, 3, 4, 5, 6, 1, 2, 3]
    assert p.propose(tokens, max_drafts=10) == [4, 5, 6]
    assert p.propose(tokens, max_drafts=2) == [4, 5]
    # Only a 1-gram matches: the token after the latest earlier 7.
    assert p.propose([7, 1, 7, 2, 5, 7], max_drafts=10) == [2, 5, 7]
    # Drafts stop at the end of the known tokens.
    assert p.propose([4, 4], max_drafts=10) == [4]
    assert p.propose([1, 2, 3], max_drafts=10) == []
    strict = NgramProposer(3, prompt_lookup_min=2, prompt_lookup_max=2)
    assert strict.propose([7, 1, 7, 2, 5, 7], max_drafts=10) == []


def test_stats_count_per_position_and_format_vllm_log_line():
    s = SpecDecodingStats(num_spec_tokens=3)
    s.observe_draft(3, 2)
    s.observe_draft(3, 0)
    older = s.copy()
    s.observe_draft(2, 2)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 8, 4)
    assert s.num_accepted_tokens_per_pos == [2, 2, 0]
    delta = s.minus(older)
    assert (delta.num_drafts, delta.num_accepted_tokens_per_pos) == (1, [1, 1, 0])
    line = s.log_line()
    assert "Mean acceptance length: 2.33" in line and "Avg Draft acceptance rate: 50.0%" in line


def test_verify_with_refuses_pipeline_parallelism():
    from types import SimpleNamespace
    spec = SpeculativeConfig.from_cli({"num_speculative_tokens": 2})

    def config(pp: int = 1, async_scheduling: bool = False):
        return SimpleNamespace(
            parallel_config=SimpleNamespace(pipeline_parallel_size=pp, tensor_parallel_size=1),
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
            device_config=SimpleNamespace(device="cpu"))

    spec.verify_with(config())
    spec.verify_with(config(async_scheduling=True))  # accepted: steps wait (EngineCore)
    with pytest.raises(ValueError, match="speculative_config.*pipeline_parallel_size"):
        spec.verify_with(config(pp=2))


def test_benchmark_script_builds_each_methods_config():
    from benchmarks.benchmark_spec_decode import build_parser, spec_config
    args = build_parser().parse_args(["--num-speculative-tokens", "3"])
    assert spec_config("none", args, "/m") is None
    ngram = SpeculativeConfig.from_cli(spec_config("ngram", args, "/m"))
    assert (ngram.num_speculative_tokens, ngram.prompt_lookup_max) == (3, 4)
    assert spec_config("draft_model", args, "/m") == {"model": "/m",
                                                      "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="--methods"):
        spec_config("eagle", args, "/m")
