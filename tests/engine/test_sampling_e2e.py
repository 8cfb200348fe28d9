"""Sampling parameters end to end through LLM.generate on the default model."""
from __future__ import annotations

import pytest

from vllm import SamplingParams

PROMPT = "Once upon a time"


def _gen(llm, params, prompts=(PROMPT,)):
    return llm.generate(list(prompts), params, use_tqdm=False)


def test_seed_reproducible_regardless_of_batch_mates(default_llm):
    p = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    alone = _gen(default_llm, p)[0].outputs[0].token_ids
    mates = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    outs = default_llm.generate(["Hello there", PROMPT, "A list of fruits:"],
                                [mates, p, mates], use_tqdm=False)
    assert outs[1].outputs[0].token_ids == alone
    other_seed = _gen(default_llm, SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24,
                                                  seed=99, ignore_eos=True))[0]
    assert other_seed.outputs[0].token_ids != alone


def test_top_k_1_equals_greedy(default_llm):
    greedy = _gen(default_llm, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    topk1 = _gen(default_llm, SamplingParams(temperature=1.5, top_k=1, max_tokens=20,
                                             ignore_eos=True, seed=3))
    assert greedy[0].outputs[0].token_ids == topk1[0].outputs[0].token_ids


def test_n_gives_distinct_completions(default_llm):
    out = _gen(default_llm, SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7,
                                           ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    again = _gen(default_llm, SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7,
                                             ignore_eos=True))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_max_tokens_and_min_tokens(default_llm):
    out = _gen(default_llm, SamplingParams(temperature=0, max_tokens=5))[0].outputs[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    tok = default_llm.get_tokenizer()
    # Make EOS the greedy choice from the start; min_tokens must hold it off.
    bias = {tok.eos_token_id: 100.0}
    early = _gen(default_llm, SamplingParams(temperature=0, max_tokens=20, logit_bias=bias))
    assert early[0].outputs[0].token_ids == [tok.eos_token_id]
    assert early[0].outputs[0].finish_reason == "stop"
    held = _gen(default_llm, SamplingParams(temperature=0, max_tokens=20, min_tokens=6,
                                            logit_bias=bias))[0].outputs[0]
    assert len(held.token_ids) == 7 and held.token_ids[-1] == tok.eos_token_id


def test_stop_strings_and_stop_token_ids(default_llm):
    base = _gen(default_llm, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    text = base[0].outputs[0].text
    words = text.split()
    assert len(words) > 4
    stop = words[3]
    out = _gen(default_llm, SamplingParams(temperature=0, max_tokens=40, stop=[stop],
                                           ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[:text.index(stop)]
    inc = _gen(default_llm, SamplingParams(temperature=0, max_tokens=40, stop=stop,
                                           include_stop_str_in_output=True,
                                           ignore_eos=True))[0].outputs[0]
    assert inc.text == text[:text.index(stop) + len(stop)]
    third = base[0].outputs[0].token_ids[2]
    by_id = _gen(default_llm, SamplingParams(temperature=0, max_tokens=40,
                                             stop_token_ids=[third]))[0].outputs[0]
    assert by_id.token_ids == base[0].outputs[0].token_ids[:3]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == third


def test_penalties_and_bias_change_output(default_llm):
    prompt = ["Repeat after me: the the the the the the"]
    plain = _gen(default_llm, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                 prompt)[0].outputs[0].token_ids
    for kw in (dict(repetition_penalty=2.0), dict(frequency_penalty=2.0),
               dict(presence_penalty=2.0)):
        out = _gen(default_llm, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                               **kw), prompt)[0].outputs[0].token_ids
        assert out != plain, kw
    banned = plain[0]
    out = _gen(default_llm, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                           logit_bias={banned: -100}), prompt)[0]
    assert banned not in out.outputs[0].token_ids


def test_prompt_logprobs(default_llm):
    tok = default_llm.get_tokenizer()
    ids = tok.encode("The capital of France is Paris")
    out = default_llm.generate({"prompt_token_ids": ids},
                               SamplingParams(max_tokens=1, prompt_logprobs=2),
                               use_tqdm=False)[0]
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    for pos, lp in enumerate(out.prompt_logprobs[1:], start=1):
        assert ids[pos] in lp and len(lp) <= 3
        assert all(v.logprob <= 0 for v in lp.values())


def test_too_long_prompt_fails_that_request_only(default_llm):
    too_long = {"prompt_token_ids": [100] * 2000}
    with pytest.raises(ValueError, match="maximum model length"):
        default_llm.generate(["Hello", too_long], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not default_llm.llm_engine.has_unfinished_requests()
    ok = _gen(default_llm, SamplingParams(max_tokens=4))
    assert len(ok[0].outputs[0].token_ids) == 4


def test_bad_sampling_params_name_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
