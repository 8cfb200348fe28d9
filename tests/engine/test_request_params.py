"""The one owner of a request's parameters (vllm/engine/params.py): generation-config
defaults for what a client left unset, the model checks, and max_tokens."""
from __future__ import annotations

import pytest

from vllm.engine.params import (MaxTokensTooLargeError, PromptTooLongError,
                                RequestParamsPolicy)
from vllm.sampling_params import LogprobsTooLargeError, SamplingParams

DEFAULTS = {"temperature": 0.5, "top_k": 5, "max_tokens": 10}


def policy(**kw) -> RequestParamsPolicy:
    args = dict(max_model_len=64, vocab_size=100, max_logprobs=5, defaults=dict(DEFAULTS),
                generation_config={"eos_token_id": [2, 7]})
    args.update(kw)
    return RequestParamsPolicy(**args)


def test_client_unset_fields_take_the_model_defaults():
    params, max_tokens = policy().process(
        [1, 2, 3], SamplingParams.from_client(temperature=None, top_k=None, top_p=0.9,
                                              max_tokens=None), eos_token_id=2)
    assert (params.temperature, params.top_k, params.top_p) == (0.5, 5, 0.9)
    assert max_tokens == 10  # the generation config's max_new_tokens caps the room (61)
    assert params.stop_token_ids == [7] and params.eos_token_id == 2


def test_client_values_win_and_a_greedy_default_turns_truncation_off():
    params, _ = policy().process([1], SamplingParams.from_client(temperature=0.8, top_k=None,
                                                                 max_tokens=None), None)
    assert (params.temperature, params.top_k) == (0.8, 5)
    greedy, _ = policy(defaults={"temperature": 0.0}).process(
        [1], SamplingParams.from_client(temperature=None, top_k=3, max_tokens=None), None)
    assert (greedy.temperature, greedy.top_k) == (0.0, 0)


def test_params_built_in_python_are_taken_as_given():
    params, max_tokens = policy().process([1, 2], SamplingParams(max_tokens=100), None)
    assert params.temperature == 1.0 and params.top_k == 0
    assert max_tokens == 62  # clamped to the room, not refused (vLLM offline)
    _, fill = policy().process([1, 2], SamplingParams(max_tokens=None), None)
    assert fill == 62
    assert policy().default_sampling_params().temperature == 0.5


def test_client_max_tokens():
    p = policy(defaults={})
    assert p.process([1] * 4, SamplingParams.from_client(max_tokens=None), None)[1] == 60
    assert p.process([1] * 4, SamplingParams.from_client(max_tokens=60), None)[1] == 60
    with pytest.raises(MaxTokensTooLargeError, match=r"However, you requested 65 tokens "
                       r"\(4 in the prompt, 61 in the completion\)") as info:
        p.process([1] * 4, SamplingParams.from_client(max_tokens=61), None)
    assert (info.value.prompt_len, info.value.max_tokens, info.value.max_model_len) == (4, 61,
                                                                                         64)
    assert policy().process([1], SamplingParams.from_client(max_tokens=30), None)[1] == 10
    with pytest.raises(ValueError, match="min_tokens must be less than or equal to "
                       "max_tokens=10"):
        policy().process([1], SamplingParams.from_client(max_tokens=None, min_tokens=20), None)


def test_prompt_checks():
    with pytest.raises(PromptTooLongError, match=r"The decoder prompt \(length 64\) is longer "
                       "than the maximum model length of 64"):
        policy().process([1] * 64, SamplingParams(), None)
    with pytest.raises(ValueError, match="cannot be empty"):
        policy().process([], SamplingParams(), None)
    with pytest.raises(ValueError, match="Token id 100 is out of vocabulary"):
        policy().process([100], SamplingParams(), None)
    with pytest.raises(LogprobsTooLargeError, match="logprobs=6") as info:
        policy().process([1], SamplingParams(logprobs=6), None)
    assert (info.value.name, info.value.value, info.value.cap) == ("logprobs", 6, 5)
    policy(max_logprobs=-1).process([1], SamplingParams(logprobs=99), None)  # vocab cap


def test_the_callers_params_are_not_modified():
    sent = SamplingParams.from_client(temperature=None, max_tokens=None)
    policy().process([1], sent, 2)
    assert sent.temperature == 1.0 and sent.max_tokens is None and sent.eos_token_id is None
