"""Benchmark request sources: synthetic, ShareGPT and random."""
from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.datasets import (Corpus, SyntheticConfig, get_requests, get_tokenizer,
                                 is_valid_sequence, sample_random_requests,
                                 sample_sharegpt_requests, sample_synthetic_lengths,
                                 sample_synthetic_requests, synthetic_sharegpt_conversations)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_factory):
    return get_tokenizer(tiny_model_factory("llama"))


def _count(tokenizer, text: str, special: bool = True) -> int:
    return len(tokenizer(text, add_special_tokens=special).input_ids)


# --------------------------------------------------------------------------- synthetic
def test_synthetic_is_deterministic_for_a_seed(tokenizer):
    a = sample_synthetic_requests(20, tokenizer, seed=3)
    b = sample_synthetic_requests(20, tokenizer, seed=3)
    c = sample_synthetic_requests(20, tokenizer, seed=4)
    assert [(r.prompt, r.prompt_len, r.expected_output_len) for r in a] == \
        [(r.prompt, r.prompt_len, r.expected_output_len) for r in b]
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_synthetic_lengths_within_bounds_and_measured(tokenizer):
    reqs = sample_synthetic_requests(60, tokenizer, seed=0, max_model_len=256)
    for r in reqs:
        assert 4 <= r.prompt_len
        assert r.expected_output_len >= 4
        assert r.prompt_len + r.expected_output_len <= 256
        # prompt_len is the engine's count of the actual text.
        assert r.prompt_len == _count(tokenizer, r.prompt) == len(r.prompt_token_ids)
        assert not r.use_token_ids
    # The text hits its sampled length (at most a token short where a cut re-tokenizes).
    targets = sample_synthetic_lengths(60, seed=0, max_model_len=256)
    assert all(t[0] - 2 <= r.prompt_len <= t[0] for r, t in zip(reqs, targets))


def test_synthetic_length_distribution_is_skewed_and_clipped():
    lengths = sample_synthetic_lengths(4000, seed=1)
    prompts = sorted(p for p, _ in lengths)
    outputs = sorted(o for _, o in lengths)
    median_prompt = prompts[len(prompts) // 2]
    assert abs(median_prompt - SyntheticConfig.prompt_len_median) < 15
    # Long right tail: mean well above median, as in chat traffic.
    assert sum(prompts) / len(prompts) > 1.3 * median_prompt
    assert prompts[0] >= 4 and prompts[-1] <= 1024
    assert all(p + o <= 2048 for p, o in lengths) and outputs[0] >= 4


def test_synthetic_prompts_start_with_an_instruction_and_vary(tokenizer):
    corpus = Corpus.load()
    reqs = sample_synthetic_requests(30, tokenizer, seed=0)
    long_ones = [r for r in reqs if r.prompt_len > 40]
    assert long_ones
    for r in long_ones:
        assert any(r.prompt.startswith(i) for i in corpus.instructions)
    # Different requests do not share their first 16 tokens (one KV block) wholesale.
    heads = {tuple(r.prompt_token_ids[:16]) for r in long_ones}
    assert len(heads) >= len(long_ones) - 2


def test_synthetic_fixed_output_len(tokenizer):
    reqs = sample_synthetic_requests(10, tokenizer, seed=0, fixed_output_len=7)
    assert {r.expected_output_len for r in reqs} == {7}
    with pytest.raises(ValueError, match="output_len"):
        sample_synthetic_requests(3, tokenizer, fixed_output_len=0)


def test_synthetic_config_validation():
    with pytest.raises(ValueError, match="prompt_len_sigma"):
        SyntheticConfig(prompt_len_sigma=-1)
    with pytest.raises(ValueError, match="output_len_median"):
        SyntheticConfig(output_len_median=0)


# --------------------------------------------------------------------------- ShareGPT
def _conv(*turns):
    return {"conversations": [{"from": f, "value": v} for f, v in turns]}


LONG_Q = "Could you explain in a few sentences how a lighthouse keeps ships away from rocks?"
LONG_A = ("A lighthouse shows a bright light with a known pattern, so sailors can tell where "
          "they are and steer clear of the dangerous coast at night.")


def _write_sharegpt(tmp_path):
    data = [
        _conv(("human", LONG_Q), ("gpt", LONG_A)),
        _conv(("gpt", "Hello! How can I help you today with anything at all?"),
              ("human", "Please describe the water cycle for a school project, briefly."),
              ("gpt", "Water evaporates, forms clouds, falls as rain and flows back to sea.")),
        _conv(("human", "Hi"), ("gpt", "Hello there, what would you like to talk about?")),
        _conv(("human", "A prompt with no reply at all, which cannot be used.")),
        "not a conversation",
        {"id": "no-turns"},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_sharegpt_loader_first_human_turn_and_reply_length(tokenizer, tmp_path):
    path = _write_sharegpt(tmp_path)
    reqs = sample_sharegpt_requests(path, 2, tokenizer, seed=0)
    by_prompt = {r.prompt: r for r in reqs}
    assert set(by_prompt) == {LONG_Q, "Please describe the water cycle for a school project, "
                                      "briefly."}
    r = by_prompt[LONG_Q]
    assert r.prompt_len == _count(tokenizer, LONG_Q)
    assert r.expected_output_len == _count(tokenizer, LONG_A, special=False)
    assert r.prompt_token_ids == list(tokenizer(LONG_Q).input_ids)


def test_sharegpt_filters_short_prompts_and_oversamples(tokenizer, tmp_path):
    path = _write_sharegpt(tmp_path)
    reqs = sample_sharegpt_requests(path, 5, tokenizer, seed=1)
    assert len(reqs) == 5
    assert all(r.prompt != "Hi" for r in reqs)  # 1-token prompt is filtered out
    assert len({r.prompt for r in reqs}) == 2


def test_sharegpt_fixed_output_len_and_seeded_order(tokenizer, tmp_path):
    path = _write_sharegpt(tmp_path)
    fixed = sample_sharegpt_requests(path, 2, tokenizer, fixed_output_len=3)
    assert [r.expected_output_len for r in fixed] == [3, 3]
    orders = {tuple(r.prompt for r in sample_sharegpt_requests(path, 2, tokenizer, seed=s))
              for s in range(8)}
    assert len(orders) == 2  # the shuffle depends on the seed
    assert [r.prompt for r in sample_sharegpt_requests(path, 2, tokenizer, seed=5)] == \
        [r.prompt for r in sample_sharegpt_requests(path, 2, tokenizer, seed=5)]


def test_sharegpt_bad_files(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="not found"):
        sample_sharegpt_requests(str(tmp_path / "missing.json"), 1, tokenizer)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"conversations": []}))
    with pytest.raises(ValueError, match="JSON list"):
        sample_sharegpt_requests(str(bad), 1, tokenizer)
    short = tmp_path / "short.json"
    short.write_text(json.dumps([_conv(("human", "Hi"), ("gpt", "Hello, nice to meet you."))]))
    with pytest.raises(ValueError, match="length filter"):
        sample_sharegpt_requests(str(short), 1, tokenizer)


def test_is_valid_sequence_matches_vllm_filter():
    assert is_valid_sequence(4, 4)
    assert not is_valid_sequence(3, 100)
    assert not is_valid_sequence(100, 3)
    assert is_valid_sequence(100, 3, skip_min_output_len_check=True)
    assert not is_valid_sequence(1025, 10)
    assert not is_valid_sequence(1000, 1049)


def test_synthetic_sharegpt_round_trip(tokenizer, tmp_path):
    convs = synthetic_sharegpt_conversations(8, tokenizer, seed=2, max_model_len=512)
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(convs))
    original = sample_synthetic_requests(8, tokenizer, seed=2, max_model_len=512)
    loaded = sample_sharegpt_requests(str(path), 8, tokenizer, max_model_len=512)
    by_prompt = {r.prompt: r for r in loaded}
    for r in original:
        if r.expected_output_len < 4:
            continue
        got = by_prompt[r.prompt]
        assert got.prompt_len == r.prompt_len
        assert abs(got.expected_output_len - r.expected_output_len) <= 2


# --------------------------------------------------------------------------- random
def test_random_lengths_exact_and_no_special_tokens(tokenizer):
    reqs = sample_random_requests(6, tokenizer, input_len=24, output_len=9, seed=0)
    special = set(tokenizer.all_special_ids)
    for r in reqs:
        assert r.prompt_len == len(r.prompt_token_ids) == 24
        assert r.expected_output_len == 9
        assert r.use_token_ids
        assert r.engine_prompt() == {"prompt_token_ids": r.prompt_token_ids}
        assert not special & set(r.prompt_token_ids)
        assert all(0 <= t < tokenizer.vocab_size for t in r.prompt_token_ids)
    # The decoded text usually re-tokenizes to the same length (what serving sends).
    same = sum(_count(tokenizer, r.prompt, special=False) == 24 for r in reqs)
    assert same >= 5
    again = sample_random_requests(6, tokenizer, input_len=24, output_len=9, seed=0)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in reqs]


def test_random_range_ratio_and_validation(tokenizer):
    reqs = sample_random_requests(40, tokenizer, input_len=20, output_len=10, seed=0,
                                  range_ratio=0.5)
    assert all(10 <= r.prompt_len <= 30 and 5 <= r.expected_output_len <= 15 for r in reqs)
    assert len({r.prompt_len for r in reqs}) > 3
    with pytest.raises(ValueError, match="random_range_ratio"):
        sample_random_requests(1, tokenizer, 8, 8, range_ratio=1.0)
    with pytest.raises(ValueError, match="input_len"):
        sample_random_requests(1, tokenizer, 0, 8)


def _args(**kw):
    base = dict(dataset=None, dataset_name=None, input_len=None, output_len=None,
                random_range_ratio=0.0, num_prompts=3, seed=0,
                synthetic_prompt_len_median=SyntheticConfig.prompt_len_median,
                synthetic_output_len_median=SyntheticConfig.output_len_median)
    base.update(kw)
    return argparse.Namespace(**base)


def test_get_requests_dispatch_and_errors(tokenizer, tmp_path):
    assert len(get_requests(_args(input_len=8, output_len=4), tokenizer)) == 3
    with pytest.raises(ValueError, match="--input-len"):
        get_requests(_args(), tokenizer)
    with pytest.raises(ValueError, match="max_model_len"):
        get_requests(_args(input_len=100, output_len=100), tokenizer, max_model_len=128)
    with pytest.raises(ValueError, match="needs --dataset"):
        get_requests(_args(dataset_name="sharegpt"), tokenizer)
    synthetic = get_requests(_args(dataset_name="synthetic", output_len=5), tokenizer)
    assert [r.expected_output_len for r in synthetic] == [5, 5, 5]
    path = _write_sharegpt(tmp_path)
    assert len(get_requests(_args(dataset=path), tokenizer)) == 3
