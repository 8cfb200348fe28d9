"""SamplingParams: vLLM's defaults, normalization, and errors that name the field."""
from __future__ import annotations

import pytest

from vllm.sampling_params import (RequestOutputKind, SamplingParams, SamplingType)


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.best_of, p.temperature, p.top_p, p.top_k, p.min_p) == (1, None, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs) == (16, 0, None, None)
    assert p.stop == [] and p.stop_token_ids == [] and p.seed is None
    assert p.skip_special_tokens and p.spaces_between_special_tokens and p.detokenize
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert p.output_kind is RequestOutputKind.CUMULATIVE
    assert p.sampling_type is SamplingType.RANDOM


def test_normalization():
    p = SamplingParams(top_k=-1, seed=-1, stop="###", logit_bias={"5": 250, 7: -300, "9": 1.5})
    assert p.top_k == 0
    assert p.seed is None
    assert p.stop == ["###"]
    assert p.logit_bias == {5: 100.0, 7: -100.0, 9: 1.5}
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_greedy_turns_truncation_off():
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert p.sampling_type is SamplingType.GREEDY
    assert SamplingParams(seed=3).sampling_type is SamplingType.RANDOM_SEED


def test_tiny_temperature_is_raised_to_avoid_overflow():
    assert SamplingParams(temperature=1e-3).temperature == pytest.approx(1e-2)
    assert SamplingParams(temperature=1e-6).sampling_type is SamplingType.GREEDY


@pytest.mark.parametrize("kwargs, field", [
    (dict(n=0), "n"),
    (dict(n=2, best_of=1), "best_of"),
    (dict(n=1, best_of=3), "best_of"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.1), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.1), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=10, max_tokens=5), "min_tokens"),
    (dict(logprobs=-2), "logprobs"),
    (dict(prompt_logprobs=-3), "prompt_logprobs"),
    (dict(stop_token_ids=[1, "x"]), "stop_token_ids"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(seed="abc"), "seed"),
    (dict(stop=["ok", ""]), "stop"),
    (dict(stop="x", detokenize=False), "stop"),
    (dict(bad_words=["foo", " "]), "bad_words"),
    (dict(logit_bias={"abc": 1.0}), "logit_bias"),
    (dict(logit_bias={1: "high"}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[3, -4]), "allowed_token_ids"),
    (dict(output_kind=7), "output_kind"),
    (dict(n=3, temperature=0.0), "n"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_full_vocab_logprobs_need_the_cap_lifted():
    p = SamplingParams(logprobs=-1, prompt_logprobs=-1)
    with pytest.raises(ValueError, match="max allowed: 20"):
        p.clone().verify_against(vocab_size=100, max_logprobs=20)
    p.verify_against(vocab_size=100, max_logprobs=-1)
    assert (p.logprobs, p.prompt_logprobs) == (100, 100)


def test_eos_and_generation_config():
    p = SamplingParams(stop_token_ids=[5])
    p.update_from_generation_config({"eos_token_id": [2, 7]}, eos_token_id=2)
    assert p.eos_token_id == 2
    assert p.stop_token_ids == [5, 7]  # the extra eos becomes a stop token (stop_reason)
    assert p.all_stop_token_ids == {2, 5, 7}

    q = SamplingParams(stop_token_ids=[5], ignore_eos=True)
    q.update_from_generation_config({"eos_token_id": [2, 7]}, eos_token_id=2)
    assert q.all_stop_token_ids == {5}

    r = SamplingParams()
    r.update_from_generation_config({}, eos_token_id=0)
    assert r.all_stop_token_ids == {0}


def test_verify_against_model_limits():
    SamplingParams(logprobs=5, stop_token_ids=[9], allowed_token_ids=[1, 9],
                   logit_bias={9: 1.0}).verify_against(vocab_size=10, max_logprobs=20)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21).verify_against(vocab_size=100, max_logprobs=20)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21).verify_against(vocab_size=100, max_logprobs=20)
    SamplingParams(logprobs=50).verify_against(vocab_size=100, max_logprobs=-1)
    for kwargs, field in [(dict(stop_token_ids=[10]), "stop_token_ids"),
                          (dict(allowed_token_ids=[10]), "allowed_token_ids"),
                          (dict(logit_bias={10: 1.0}), "logit_bias")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs).verify_against(vocab_size=10, max_logprobs=20)


def test_clone_is_deep():
    p = SamplingParams(stop=["a"], seed=1)
    p.update_from_generation_config({}, eos_token_id=3)
    c = p.clone()
    c.stop.append("b")
    assert p.stop == ["a"] and c.eos_token_id == 3 and c.seed == 1


def test_repr_and_helpers():
    text = repr(SamplingParams(temperature=0.8, top_p=0.95))
    assert text.startswith("SamplingParams(n=1, presence_penalty=0.0")
    assert "temperature=0.8" in text and "top_p=0.95" in text and "max_tokens=16" in text
    assert SamplingParams(stop=["ab", "abcd"]).output_text_buffer_length == 3
    assert SamplingParams(stop=["abcd"], include_stop_str_in_output=True
                          ).output_text_buffer_length == 0
    p = SamplingParams.from_optional(temperature=None, top_p=0.5, seed=None, max_tokens=None)
    assert p.temperature == 1.0 and p.top_p == 0.5 and p.max_tokens == 16
