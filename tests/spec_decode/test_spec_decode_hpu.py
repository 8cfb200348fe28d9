"""N-gram speculation on the fake HPU: a request's draft-verifying tokens are decode
rows of a bucket (decode buckets reach max_num_seqs * (k + 1) rows), the rejection
sampler runs on the bucket's fixed shape and is warmed with it. Greedy outputs equal
no speculation, and nothing compiles after warmup, in HPU-graph, lazy,
torch.compile and eager modes."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.spec_decode.test_spec_decode_e2e import PROMPTS
from vllm import SamplingParams

K = 2
MAX_NUM_SEQS = 2
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}
# Few buckets (warmup runs each in four modes): decode rows up to 2 x (2 + 1).
ENV = dict(SMALL_BUCKETS, VLLM_DECODE_BS_BUCKET_MAX=str(MAX_NUM_SEQS * (K + 1)),
           VLLM_DECODE_BLOCK_BUCKET_MAX="32", VLLM_PROMPT_SEQ_BUCKET_MAX="64")
ARGS = dict(max_num_seqs=MAX_NUM_SEQS, block_size=16, max_model_len=96,
            kv_cache_memory_bytes=2 << 20)


def _params() -> list[SamplingParams]:
    greedy = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * (i % 7), ignore_eos=True)
              for i in range(len(PROMPTS))]
    # Sampled rows and logprobs go through the same warmed rejection-sampler shapes.
    greedy[3] = SamplingParams(temperature=0.8, top_k=5, seed=7, max_tokens=12,
                               ignore_eos=True, logprobs=2)
    return greedy


@pytest.fixture(scope="module")
def expected(tiny_model_factory):
    """Without speculation, on CPU (the fake HPU matches it: tests/hpu/test_hpu_modes)."""
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        llm = make_llm(model=path, **ARGS)
        out = [list(o.outputs[0].token_ids)
               for o in llm.generate(PROMPTS, _params(), use_tqdm=False)]
        release(llm)
    return path, out


@pytest.mark.parametrize("lazy,eager,mode", [
    ("1", False, "HPU graphs"), ("1", True, "lazy"), ("0", False, "torch.compile"),
    ("0", True, "eager")])
def test_ngram_on_hpu_matches_and_compiles_nothing_after_warmup(expected, lazy, eager, mode):
    path, want = expected
    with platform_env("hpu", PT_HPU_LAZY_MODE=lazy, **ENV):
        llm = make_llm(model=path, enforce_eager=eager, speculative_config=NGRAM, **ARGS)
        try:
            runner = runner_of(llm)
            assert runner.mode.value == mode
            assert max(b.batch_size for b in runner.bucketing.decode_buckets) == 6
            warmed = " ".join(runner.tracker.compiled_labels[False])
            assert "rejection sampler" in warmed
            got = llm.generate(PROMPTS, _params(), use_tqdm=False)
            ids = [list(o.outputs[0].token_ids) for o in got]
            greedy = [i for i in range(len(PROMPTS)) if i != 3]
            assert [ids[i] for i in greedy] == [want[i] for i in greedy]
            assert len(got[3].outputs[0].logprobs) == len(ids[3]) == 12
            stats = llm.llm_engine.get_stats().spec_decoding_stats
            assert stats.num_accepted_tokens > 0
            assert runner.num_compiles_after_warmup == 0
            assert runner.bucketing.fallback_buckets == []
        finally:
            release(llm)
