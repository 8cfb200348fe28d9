"""--scheduling-policy priority end to end on a tiny model: a better request that arrives
while the batch is full preempts the worst running one, both finish with the greedy
output they have alone, and a non-zero priority under fcfs is refused as in vLLM."""
from __future__ import annotations

import pytest

from vllm import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = {"low": "the cat sat on", "lower": "a dog ran far", "high": "one two three"}


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    return LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=64,
               scheduling_policy="priority", max_num_seqs=2)


def _alone(llm, prompt):
    return list(llm.generate([prompt], PARAMS, use_tqdm=False)[0].outputs[0].token_ids)


def test_better_request_preempts_the_worst_running_one(llm):
    engine = llm.llm_engine
    engine.add_request("low", PROMPTS["low"], PARAMS, priority=5)
    engine.add_request("lower", PROMPTS["lower"], PARAMS, priority=9)
    finished = {}
    order = []
    for _ in range(3):  # both running, a few tokens in
        for out in engine.step():
            assert not out.finished
    engine.add_request("high", PROMPTS["high"], PARAMS, priority=0)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
                order.append(out.request_id)
    # "high" took the place of "lower" (the worst running), which ran again after it.
    assert finished["lower"].metrics.num_preemptions == 1
    assert finished["low"].metrics.num_preemptions == 0
    assert finished["high"].metrics.num_preemptions == 0
    assert order.index("high") < order.index("lower")
    for name, prompt in PROMPTS.items():
        assert list(finished[name].outputs[0].token_ids) == _alone(llm, prompt), name


def test_generate_takes_one_priority_per_prompt(llm):
    prompts = list(PROMPTS.values())
    outs = llm.generate(prompts, PARAMS, use_tqdm=False, priority=[3, 1, 2])
    assert [list(o.outputs[0].token_ids) for o in outs] == [_alone(llm, p) for p in prompts]
    with pytest.raises(ValueError, match="lengths of prompts"):
        llm.generate(prompts, PARAMS, use_tqdm=False, priority=[1])


def test_nonzero_priority_needs_the_priority_policy(tiny_model_factory):
    fcfs = LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match="Priority scheduling is not enabled"):
        fcfs.generate(["a b"], PARAMS, use_tqdm=False, priority=[1])
    assert len(fcfs.generate(["a b"], PARAMS, use_tqdm=False, priority=[0])) == 1
