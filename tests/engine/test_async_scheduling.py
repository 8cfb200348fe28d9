"""--async-scheduling: step N+1 is scheduled while step N runs, and the outputs are the
same as without it: greedy and seeded tokens, stop strings, max_tokens, logprobs,
preemption, aborts, structured outputs; on CPU and the fake HPU."""
from __future__ import annotations

import asyncio
import gc
import json

import jsonschema
import pytest

from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

PROMPTS = [f"Request {i}: the story of the number {i} begins with" + " and" * (i * 7)
           for i in range(8)]


def _params() -> list[SamplingParams]:
    out = [SamplingParams(temperature=0, max_tokens=8 + 5 * i, ignore_eos=True)
           for i in range(4)]
    out += [SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=20, n=2,
                           ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=30, stop=[" the", " a"],
                           ignore_eos=True),
            SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=25, logprobs=3,
                           presence_penalty=0.5, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=1)]
    return out


def _tokens(outs) -> list:
    return [[(c.token_ids, c.text, c.finish_reason,
              None if c.logprobs is None else
              [{k: round(v.logprob, 4) for k, v in lp.items()} for lp in c.logprobs])
             for c in o.outputs] for o in outs]


def _release(llm: LLM) -> None:
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def tiny(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def reference(tiny) -> list:
    llm = LLM(model=tiny, dtype="float32", max_model_len=512)
    try:
        return _tokens(llm.generate(PROMPTS, _params(), use_tqdm=False))
    finally:
        _release(llm)


@pytest.fixture(scope="module")
def async_llm(tiny):
    llm = LLM(model=tiny, dtype="float32", max_model_len=512, async_scheduling=True)
    yield llm
    _release(llm)


def test_same_outputs_and_the_next_step_is_scheduled_ahead(async_llm, reference):
    scheduler = async_llm.llm_engine.engine_core.scheduler
    ahead = []
    schedule = scheduler.schedule

    def spy():
        # Requests whose previous step is still running when this one is scheduled.
        ahead.append(sum(1 for r in scheduler.running if r.num_output_placeholders))
        return schedule()

    scheduler.schedule = spy
    try:
        outs = async_llm.generate(PROMPTS, _params(), use_tqdm=False)
    finally:
        scheduler.schedule = schedule
    assert _tokens(outs) == reference
    assert max(ahead) >= 4, ahead  # decode steps overlapped the previous one


def test_preemption_under_async_scheduling(tiny):
    """40 KV blocks for 12 requests of ~100 tokens: preempted while a step is in flight."""
    prompts = [f"Request number {i} tells a story about" for i in range(12)]
    params = [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=96, seed=1000 + i,
                             ignore_eos=True) for i in range(12)]
    results = []
    for async_scheduling in (False, True):
        llm = LLM(model=tiny, dtype="float32", max_model_len=256, max_num_seqs=12,
                  num_gpu_blocks_override=40, enable_prefix_caching=False,
                  async_scheduling=async_scheduling)
        try:
            results.append([o.outputs[0].token_ids
                            for o in llm.generate(prompts, params, use_tqdm=False)])
            assert llm.llm_engine.get_stats().num_preemptions > 0
        finally:
            _release(llm)
    assert results[0] == results[1]


def test_structured_output_under_async_scheduling(async_llm):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}},
              "required": ["n"], "additionalProperties": False}
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=
                            StructuredOutputsParams(json=schema))
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outs = async_llm.generate(["Give me JSON:", "Once upon a time"], [params, free],
                              use_tqdm=False)
    jsonschema.validate(json.loads(outs[0].outputs[0].text), schema)
    assert len(outs[1].outputs[0].token_ids) == 20


def test_abort_mid_stream_under_async_scheduling(tiny):
    """The core in its own process with async scheduling: an aborted stream ends, the
    others finish with the tokens of the plain engine."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    plain = LLM(model=tiny, dtype="float32", max_model_len=512)
    try:
        expected = [o.outputs[0].token_ids for o in plain.generate(
            PROMPTS[:4], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
            use_tqdm=False)]
    finally:
        _release(plain)

    async def main() -> list:
        engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(
            model=tiny, dtype="float32", max_model_len=512, async_scheduling=True))
        try:
            params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

            async def run(i: int) -> list[int]:
                stream = await engine.add_request(f"r{i}", PROMPTS[i], params)
                tokens: list[int] = []
                async for out in engine.iterate(stream):
                    tokens = out.outputs[0].token_ids
                    if i == 1 and len(tokens) >= 5:
                        await engine.abort("r1")
                return list(tokens)

            return await asyncio.gather(*(run(i) for i in range(4)))
        finally:
            engine.shutdown()

    got = asyncio.run(main())
    assert 5 <= len(got[1]) < 40
    assert got[1] == expected[1][:len(got[1])]
    assert [got[i] for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]


def test_fake_hpu_under_async_scheduling(tiny):
    from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    results = []
    for async_scheduling in (False, True):
        with platform_env("hpu", **SMALL_BUCKETS):
            llm = make_llm(model=tiny, async_scheduling=async_scheduling)
            try:
                results.append([o.outputs[0].token_ids
                                for o in llm.generate(PROMPTS[:4], params, use_tqdm=False)])
                stats = llm.llm_engine.get_compile_stats()
                assert stats["num_compiles_after_warmup"] == 0, stats
            finally:
                _release(llm)
    assert results[0] == results[1]
