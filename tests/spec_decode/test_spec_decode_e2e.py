"""Speculative decoding end to end on CPU (n-gram proposer, tiny random-weight model):
greedy outputs token-identical to no speculation (stop strings, max_tokens, n > 1,
prefix caching, chunked prefill, logprobs), seeded sampling reproducible, and the
sampled distribution the target's (two-sample chi-square)."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from vllm import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}
COMMON = dict(dtype="float32", max_model_len=512, max_num_seqs=32,
              max_num_batched_tokens=64, kv_cache_memory_bytes=64 << 20)
"""A 64-token budget chunks the longer prompts and cuts drafts when the step is full."""

PROMPTS = [
    "a b c d a b c d a b c d a b",
    "1 2 3 4 5 1 2 3 4 5 1 2 3 4 5 1 2",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "red green blue red green blue red green blue red",
    "Once upon a time, in a small village by the sea,",
    "The capital of France is",
    "List three benefits of regular exercise:",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "Translate to French: Good morning, how are you?",
    "x = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1",
    "Monday Tuesday Wednesday Monday Tuesday Wednesday Monday",
    "<html><body><p>hi</p><p>hi</p><p>hi</p><p>",
    "one two three four five six seven eight nine ten " * 4,
    "SELECT * FROM users WHERE id = 1; SELECT * FROM users WHERE id =",
]


@pytest.fixture(scope="module")
def model(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def baseline(model):
    llm = LLM(model=model, **COMMON)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def spec(model):
    llm = LLM(model=model, speculative_config=NGRAM, **COMMON)
    yield llm
    del llm
    gc.collect()


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def _ids(outputs):
    return [[list(c.token_ids) for c in o.outputs] for o in outputs]


def test_greedy_is_token_identical_and_drafts_are_accepted(baseline, spec):
    params = [_greedy(5 + 7 * (i % 6)) for i in range(len(PROMPTS))]  # 5 .. 40 tokens
    before = spec.llm_engine.get_stats().spec_decoding_stats.copy()
    want = baseline.generate(PROMPTS, params, use_tqdm=False)
    got = spec.generate(PROMPTS, params, use_tqdm=False)
    assert _ids(got) == _ids(want)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]
    assert all(len(o.outputs[0].token_ids) == p.max_tokens for o, p in zip(got, params))
    stats = spec.llm_engine.get_stats().spec_decoding_stats.minus(before)
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens


def test_greedy_stop_strings_n_and_logprobs_match(baseline, spec):
    plain = baseline.generate(PROMPTS, _greedy(24), use_tqdm=False)
    # A stop string from the middle of each reference text: it must end the output
    # at the same place although several tokens arrive per step.
    stops = [o.outputs[0].text[10:13] or "zzz" for o in plain]
    # n=2: top_k=1 samples the argmax (greedy proper refuses n > 1).
    params = [SamplingParams(temperature=1.0, top_k=1, max_tokens=24, ignore_eos=True,
                             stop=[s], n=2, logprobs=2) for s in stops]
    want = baseline.generate(PROMPTS, params, use_tqdm=False)
    got = spec.generate(PROMPTS, params, use_tqdm=False)
    assert _ids(got) == _ids(want)
    for g, w in zip(got, want):
        for gc_, wc in zip(g.outputs, w.outputs):
            assert (gc_.text, gc_.finish_reason, gc_.stop_reason) == \
                (wc.text, wc.finish_reason, wc.stop_reason)
            assert len(gc_.logprobs) == len(gc_.token_ids)
            for glp, wlp in zip(gc_.logprobs, wc.logprobs):
                assert glp.keys() == wlp.keys()
                for t in glp:
                    assert glp[t].logprob == pytest.approx(wlp[t].logprob, abs=1e-4)
    assert any(o.outputs[0].finish_reason == "stop" for o in got)


def test_prefix_cache_hits_stay_identical(baseline, spec):
    shared = PROMPTS[14] * 2  # > 4 blocks of 16: cached after the first request
    prompts = [shared + " eleven", shared + " twelve", shared + " one two"]
    for llm in (baseline, spec):
        llm.generate(prompts[:1], _greedy(4), use_tqdm=False)
    want = baseline.generate(prompts, _greedy(30), use_tqdm=False)
    got = spec.generate(prompts, _greedy(30), use_tqdm=False)
    assert _ids(got) == _ids(want)
    assert all(o.num_cached_tokens > 0 for o in got)


def test_seeded_sampling_is_reproducible(spec):
    params = [SamplingParams(temperature=1.0, top_k=5, seed=100 + i, max_tokens=20,
                             ignore_eos=True) for i in range(4)]
    first = spec.generate(PROMPTS[:4], params, use_tqdm=False)
    again = spec.generate(PROMPTS[:4], params, use_tqdm=False)
    assert _ids(first) == _ids(again)


def test_sampled_distribution_matches_no_speculation(baseline, spec):
    """The 2nd and 3rd tokens (the first ones verified against drafts) follow the
    same law with and without speculation: chi-square test of homogeneity. The
    prompt is the model's own greedy text, so the n-gram proposer finds drafts."""
    seed = baseline.generate(["1 2 3 1 2 3 1 2 3"], _greedy(30), use_tqdm=False)[0]
    prompt = {"prompt_token_ids": list(seed.prompt_token_ids)
              + list(seed.outputs[0].token_ids)}
    params = SamplingParams(temperature=0.8, top_k=3, max_tokens=3, ignore_eos=True)
    n = 300
    before = spec.llm_engine.get_stats().spec_decoding_stats.copy()
    samples = {}
    for name, llm in (("base", baseline), ("spec", spec)):
        outs = llm.generate([prompt] * n, params, use_tqdm=False)
        samples[name] = [tuple(o.outputs[0].token_ids) for o in outs]
    stats = spec.llm_engine.get_stats().spec_decoding_stats.minus(before)
    assert stats.num_drafts > n // 2 and stats.num_accepted_tokens > 0
    for pos in (1, 2):
        values = sorted({s[pos] for v in samples.values() for s in v})
        table = np.array([[sum(s[pos] == t for s in samples[name]) for t in values]
                          for name in ("base", "spec")])
        table = table[:, table.sum(0) >= 10]  # chi-square needs populated cells
        assert table.shape[1] > 1
        assert chi2_contingency(table).pvalue > 1e-3, table


def test_refused_combinations_name_the_field(model):
    with pytest.raises(ValueError, match="speculative_config"):
        LLM(model=model, pipeline_parallel_size=2, speculative_config=NGRAM, **COMMON)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(model=model, speculative_config={"method": "ngram"}, **COMMON)


def test_async_scheduling_with_speculation_is_token_identical(baseline, model):
    """--async-scheduling with n-gram speculation: each step waits for the accepted
    tokens (the drafts come from them); the tokens are those without speculation."""
    params = [_greedy(5 + 7 * (i % 6)) for i in range(len(PROMPTS))]
    want = baseline.generate(PROMPTS, params, use_tqdm=False)
    llm = LLM(model=model, async_scheduling=True, speculative_config=NGRAM, **COMMON)
    try:
        assert llm.llm_engine.engine_core._must_sync()
        got = llm.generate(PROMPTS, params, use_tqdm=False)
        assert _ids(got) == _ids(want)
        assert llm.llm_engine.get_stats().spec_decoding_stats.num_accepted_tokens > 0
    finally:
        llm.llm_engine.shutdown()


# ------------------------------------------------------------------ draft model
@pytest.mark.parametrize("draft_layers", [None, 1])
def test_draft_model_greedy_is_token_identical(baseline, model, tiny_model_factory,
                                               draft_layers):
    """A draft that is the target itself is always right (acceptance 100%); another
    (1-layer, different weights) is mostly wrong; both give the target's tokens."""
    draft = model if draft_layers is None else tiny_model_factory(
        "llama", num_hidden_layers=draft_layers)
    llm = LLM(model=model, speculative_config={"model": draft, "num_speculative_tokens": 4},
              **COMMON)
    try:
        params = [_greedy(5 + 7 * (i % 6)) for i in range(len(PROMPTS))]
        want = baseline.generate(PROMPTS, params, use_tqdm=False)
        got = llm.generate(PROMPTS, params, use_tqdm=False)
        assert _ids(got) == _ids(want)
        stats = llm.llm_engine.get_stats().spec_decoding_stats
        assert stats.num_drafts > 0
        if draft_layers is None:
            assert stats.acceptance_rate == 1.0
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("draft_len", [None, 32])
def test_draft_with_a_shorter_context(baseline, model, tiny_model_factory, draft_len):
    """A draft whose context (max_position_embeddings 48) is shorter than the target's
    serves as in vLLM: its max_model_len is the smaller one (or speculative_config's
    max_model_len), and past it the target verifies without drafts: same tokens."""
    draft = tiny_model_factory("llama", max_position_embeddings=48)
    config = {"model": draft, "num_speculative_tokens": 3}
    if draft_len is not None:
        config["max_model_len"] = draft_len
    llm = LLM(model=model, speculative_config=config, **COMMON)
    try:
        params = _greedy(40)
        prompts = [PROMPTS[0], PROMPTS[-2]]  # 40 tokens out: past the draft's context
        assert _ids(llm.generate(prompts, params, use_tqdm=False)) == \
            _ids(baseline.generate(prompts, params, use_tqdm=False))
        spec_config = llm.llm_engine.vllm_config.speculative_config
        assert spec_config.draft_model_config.max_model_len == (draft_len or 48)
        assert llm.llm_engine.get_stats().spec_decoding_stats.num_drafts > 0
    finally:
        del llm
        gc.collect()


def test_draft_model_of_another_vocabulary_is_refused(model, tiny_model_factory):
    other = tiny_model_factory("llama", vocab_size=1024)
    with pytest.raises(ValueError, match="speculative_config.model.*vocabulary"):
        LLM(model=model, speculative_config={"model": other, "num_speculative_tokens": 2},
            **COMMON)


def test_draft_model_refused_on_hpu(model):
    from tests.hpu.conftest import platform_env
    with platform_env("hpu"):
        with pytest.raises(ValueError, match="speculative_config.model.*ngram on hpu"):
            LLM(model=model, speculative_config={"model": model,
                                                 "num_speculative_tokens": 2}, **COMMON)


# ------------------------------------------------------- structured outputs, LoRA
def test_structured_outputs_verify_grammar_masked_drafts(baseline, spec):
    """Constrained requests take drafts the grammar allows; each verification row is
    masked by the grammar after the drafts before it: outputs equal no speculation."""
    from vllm.sampling_params import StructuredOutputsParams
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "string"}},
              "required": ["a", "b"]}
    prompts = ['{"a": 1, "b": "x"} {"a": 2, "b": "y"} {"a": 3, "b": "z"} ',
               "yes no yes no yes no yes no", 'Answer: {"a": 12, "b": "hello"}, again: ']
    kinds = [StructuredOutputsParams(json=schema), StructuredOutputsParams(choice=["yes", "no"]),
             StructuredOutputsParams(regex=r'\{"a": [0-9]{1,3}, "b": "[a-z]{1,8}"\}')]
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=k)
              for k in kinds]
    before = spec.llm_engine.get_stats().spec_decoding_stats.copy()
    want = baseline.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    assert _ids(got) == _ids(want)
    assert got[1].outputs[0].text in ("yes", "no")
    assert spec.llm_engine.get_stats().spec_decoding_stats.minus(before).num_drafts > 0


def test_lora_requests_verify_drafts_with_their_adapter(model, tmp_path_factory):
    from tests.lora.conftest import make_peft_adapter
    from vllm.lora.request import LoRARequest
    path = make_peft_adapter(model, str(tmp_path_factory.mktemp("adapter")), seed=3,
                             r=8, lora_alpha=16, target_modules=["q_proj", "v_proj",
                                                                 "down_proj"])
    lora = LoRARequest("a", 1, path)
    params = [_greedy(24) for _ in PROMPTS[:6]]
    loras = [lora, None, lora, None, lora, lora]
    outs = []
    for spec_config in (None, NGRAM):
        llm = LLM(model=model, enable_lora=True, max_loras=2, max_lora_rank=8,
                  speculative_config=spec_config, **COMMON)
        try:
            outs.append(_ids(llm.generate(PROMPTS[:6], params, lora_request=loras,
                                          use_tqdm=False)))
            if spec_config is not None:
                assert llm.llm_engine.get_stats().spec_decoding_stats.num_accepted_tokens
        finally:
            del llm
            gc.collect()
    assert outs[0] == outs[1]


def test_penalties_and_min_tokens_decode_without_drafts(baseline, spec):
    """Their distribution depends on the output so far: no drafts, same tokens."""
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                             repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=16, min_tokens=16,
                             frequency_penalty=0.5)]
    before = spec.llm_engine.get_stats().spec_decoding_stats.copy()
    want = baseline.generate(PROMPTS[:2], params, use_tqdm=False)
    got = spec.generate(PROMPTS[:2], params, use_tqdm=False)
    assert _ids(got) == _ids(want)
    assert spec.llm_engine.get_stats().spec_decoding_stats.minus(before).num_drafts == 0


def test_multi_token_bad_words_decode_without_drafts(baseline, spec):
    """A bad word of several tokens is banned by what the output ends with, which the
    drafts would change row by row: such requests get no drafts and give the tokens
    they give without speculation (single-token bad words keep their drafts)."""
    tokenizer = baseline.get_tokenizer()
    prompt = PROMPTS[3]  # repetitive: n-gram drafts are accepted
    free = list(baseline.generate(prompt, _greedy(24), use_tqdm=False)[0].outputs[0].token_ids)
    word = next(w for w in (tokenizer.decode(free[i:i + 2]) for i in range(len(free) - 1))
                if w.strip() and len(tokenizer.encode(w.strip(), add_special_tokens=False)) > 1)
    params = _greedy(24, bad_words=[word])
    before = spec.llm_engine.get_stats().spec_decoding_stats.copy()
    want = baseline.generate([prompt], params, use_tqdm=False)
    got = spec.generate([prompt], params, use_tqdm=False)
    assert _ids(got) == _ids(want)
    assert spec.llm_engine.get_stats().spec_decoding_stats.minus(before).num_drafts == 0
    single = _greedy(24, bad_words=[tokenizer.decode(free[:1]).strip() or "x"])
    assert _ids(spec.generate([prompt], single, use_tqdm=False)) == \
        _ids(baseline.generate([prompt], single, use_tqdm=False))


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_preempted_requests_resume_identically(model, method):
    """A KV pool too small for the batch: requests are preempted (draft KV slots and
    the draft model's cache included) and recomputed, with the same tokens."""
    small = dict(COMMON, num_gpu_blocks_override=20, block_size=16, max_model_len=256)
    config = NGRAM if method == "ngram" else {"model": model, "num_speculative_tokens": 3}
    params = _greedy(48)
    outs = []
    for spec_config in (None, config):
        llm = LLM(model=model, speculative_config=spec_config, **small)
        try:
            outs.append(_ids(llm.generate(PROMPTS[:10], params, use_tqdm=False)))
            assert llm.llm_engine.get_stats().num_preemptions > 0
        finally:
            del llm
            gc.collect()
    assert outs[0] == outs[1]


def test_prompt_logprobs_with_speculation(baseline, spec):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                            prompt_logprobs=1, logprobs=0)
    want = baseline.generate(PROMPTS[:3], params, use_tqdm=False)
    got = spec.generate(PROMPTS[:3], params, use_tqdm=False)
    assert _ids(got) == _ids(want)
    for g, w in zip(got, want):
        assert len(g.prompt_logprobs) == len(w.prompt_logprobs) == len(g.prompt_token_ids)
        for glp, wlp in zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:]):
            assert {t: round(v.logprob, 4) for t, v in glp.items()} == \
                {t: round(v.logprob, 4) for t, v in wlp.items()}


def test_draft_model_survives_sleep_and_wake_up(model):
    llm = LLM(model=model, enable_sleep_mode=True, speculative_config={
        "model": model, "num_speculative_tokens": 3}, **COMMON)
    try:
        first = _ids(llm.generate(PROMPTS[:4], _greedy(20), use_tqdm=False))
        llm.sleep(level=1)
        llm.wake_up()
        assert _ids(llm.generate(PROMPTS[:4], _greedy(20), use_tqdm=False)) == first
        assert llm.llm_engine.get_stats().spec_decoding_stats.acceptance_rate == 1.0
    finally:
        del llm
        gc.collect()
