"""Custom logits processors through vLLM's API (vllm.v1.sample.logits_processor): the
batch changes they are told (vLLM's order and tuple shapes), loading by class, by
qualified name, per-request arguments through extra_args, validate_params at submit
time, a raising processor failing only its request, offline on CPU and the fake HPU
(0 compiles after warmup with every knob and a custom processor in one batch)."""
from __future__ import annotations

import pytest
import torch

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.sample.custom_logitsprocs import BanTokenLogitsProcessor, ExplodingLogitsProcessor
from vllm import SamplingParams
from vllm.core.sched_output import NewRequestData
from vllm.sample.logits_processors.custom import CustomLogitsProcessors
from vllm.sample.logits_processors.load import load_custom_logitsprocs
from vllm.v1.sample.logits_processor import MoveDirectionality
from vllm.worker.input_batch import InputBatch
from vllm.worker.request_state import CachedRequestState

BAN = "tests.sample.custom_logitsprocs:BanTokenLogitsProcessor"


def _state(req_id: str, **params) -> CachedRequestState:
    new = NewRequestData(req_id=req_id, prompt_token_ids=[1, 2, 3], output_token_ids=[],
                         sampling_params=SamplingParams(**params), block_ids=[0],
                         num_computed_tokens=0, wants_prompt_logprobs=False)
    return CachedRequestState.from_new_request(new, "cpu")


def test_batch_updates_follow_vllms_order_and_shapes():
    proc = BanTokenLogitsProcessor(None, torch.device("cpu"), False)
    custom = CustomLogitsProcessors([proc])
    batch = InputBatch(4, custom=custom)
    states = [_state(f"r{i}", extra_args={"banned_token_id": i}) for i in range(3)]
    for st in states:
        batch.add_request(st)
    assert custom.update_state(batch.num_reqs) == []
    (update,) = proc.updates
    assert update.batch_size == 3 and update.removed == () and update.moved == ()
    index, params, prompt, output = update.added[2]
    assert index == 2 and params is states[2].sampling_params and prompt == [1, 2, 3]
    assert output is states[2].output_token_ids  # the live running list
    custom.update_state(batch.num_reqs)
    assert len(proc.updates) == 1  # None: nothing changed
    batch.remove_request("r0")
    batch.condense()
    custom.update_state(batch.num_reqs)
    last = proc.updates[-1]
    assert (last.batch_size, last.removed, last.added) == (2, (0,), ())
    assert last.moved == ((2, 0, MoveDirectionality.UNIDIRECTIONAL),)
    assert proc.banned == {0: 2, 1: 1}


@pytest.mark.parametrize("static_width", [None, 6])
def test_logits_are_laid_out_by_batch_row(static_width):
    """Pass rows in another order than the batch (and padding rows): the processor sees
    batch row i at row i; padding rows keep their logits."""
    proc = BanTokenLogitsProcessor(None, torch.device("cpu"), False)
    proc.banned = {0: 3, 2: 5}
    custom = CustomLogitsProcessors([proc])
    logits = torch.zeros(4, 8)
    out, failures = custom.apply(logits.clone(), [2, None, 0, 1], 3, static_width)
    assert failures == []
    assert torch.isneginf(out[0, 5]) and torch.isneginf(out[2, 3])
    assert torch.isneginf(out).sum() == 2


def test_loading_by_name_and_refusals():
    classes = load_custom_logitsprocs(
        [BAN, "tests.sample.custom_logitsprocs.ExplodingLogitsProcessor"])
    assert classes == [BanTokenLogitsProcessor, ExplodingLogitsProcessor]
    with pytest.raises(ValueError, match="cannot load"):
        load_custom_logitsprocs(["tests.sample.custom_logitsprocs:Missing"])
    with pytest.raises(ValueError, match="not a subclass"):
        load_custom_logitsprocs(["torch.nn:Linear"])


def _prompts():
    return [{"prompt_token_ids": [1, 450, 4996, 17354, 1701]},
            {"prompt_token_ids": [1, 1724, 338, 278]}]


def _greedy(**kw):
    return SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, **kw)


def _check_offline(llm) -> None:
    base = [o.outputs[0].token_ids for o in llm.generate(_prompts(), _greedy(),
                                                          use_tqdm=False)]
    banned = base[0][0]
    outs = llm.generate(_prompts(), [_greedy(extra_args={"banned_token_id": banned}),
                                     _greedy()], use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    assert got[0][0] != banned and banned not in got[0]
    assert got[1] == base[1]  # a request that does not ask is untouched
    with pytest.raises(ValueError, match="banned_token_id must be an int"):
        llm.generate(_prompts()[:1], _greedy(extra_args={"banned_token_id": "x"}),
                     use_tqdm=False)
    outs = llm.generate(_prompts(), [_greedy(extra_args={"explode": True}), _greedy()],
                        use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error"
    assert outs[1].outputs[0].token_ids == base[1]  # the engine and the batch mate go on
    again = llm.generate(_prompts(), _greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == base


def test_offline_cpu(tiny_model_factory):
    with platform_env("cpu"):
        llm = make_llm(model=tiny_model_factory("llama"), max_num_seqs=4,
                       kv_cache_memory_bytes=1 << 20,
                       logits_processors=[BAN, ExplodingLogitsProcessor])
        try:
            _check_offline(llm)
        finally:
            release(llm)


def _every_knob() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3,
                           max_tokens=4, ignore_eos=True,
                           extra_args={"banned_token_id": 7}),
            SamplingParams(temperature=0.8, seed=7, repetition_penalty=1.2, top_k=5,
                           top_p=0.9, min_p=0.05, logit_bias={5: 3.0, 9: -2.0},
                           max_tokens=3, ignore_eos=True),
            SamplingParams(temperature=0.0, min_tokens=3, max_tokens=5,
                           bad_words=["the cat", "x"]),
            SamplingParams(temperature=0.0, allowed_token_ids=list(range(10, 60)),
                           logprobs=2, max_tokens=3, ignore_eos=True,
                           extra_args={"banned_token_id": 12})]


def test_fake_hpu_compiles_nothing_after_warmup(tiny_model_factory):
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1")
    with platform_env("hpu", **env):
        llm = make_llm(model=tiny_model_factory("llama"), max_num_seqs=4, block_size=16,
                       kv_cache_memory_bytes=1 << 20,
                       logits_processors=[BAN, ExplodingLogitsProcessor])
        try:
            runner = runner_of(llm)
            prompts = _prompts() * 2
            outs = llm.generate(prompts, _every_knob(), use_tqdm=False)
            assert 7 not in outs[0].outputs[0].token_ids
            assert 12 not in outs[3].outputs[0].token_ids
            _check_offline(llm)
            assert runner.num_compiles_after_warmup == 0, runner.tracker.stats()
        finally:
            release(llm)
