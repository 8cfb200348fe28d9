"""HPU bucket ranges, filters, lookup and fallback."""
from __future__ import annotations

import logging

import pytest

from vllm.hpu.bucketing import (Bucket, HPUBucketingContext, exponential_range,
                                       linear_range)

ALL_BUCKET_VARS = [f"VLLM_{k}_{d}_BUCKET_{p}" for k in ("PROMPT", "DECODE")
                   for d in ("BS", "SEQ", "BLOCK") for p in ("MIN", "STEP", "MAX")]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ALL_BUCKET_VARS + ["VLLM_EXPONENTIAL_BUCKETING"]:
        monkeypatch.delenv(name, raising=False)


def _ctx(**kw):
    args = dict(max_num_seqs=256, max_num_prefill_seqs=None, block_size=128,
                max_num_batched_tokens=8192, max_model_len=8192)
    args.update(kw)
    return HPUBucketingContext(**args)


def test_linear_ranges():
    assert linear_range(2, 32, 64) == [2, 4, 8, 16, 32, 64]
    assert linear_range(128, 128, 512) == [128, 256, 384, 512]
    assert linear_range(0, 8, 24) == [0, 8, 16, 24]
    # min is the lowest bucket, also when step < min (the multiples below it are
    # dropped, min itself kept)
    assert linear_range(4, 2, 8) == [4, 6, 8]
    assert linear_range(3, 2, 9) == [3, 4, 6, 8]
    assert linear_range(128, 64, 256) == [128, 192, 256]


def test_exponential_known_lists():
    ctx = _ctx(num_kv_blocks=4096)
    assert ctx.decode_bs_range.values() == [1, 2, 4, 8, 14, 24, 42, 78, 140, 256]
    # log2(max) + 1 query points (vllm-gaudi's limit); decode blocks: the range in steps
    # of block_size blocks, its low end filled with powers of two (without them a
    # 7-block batch read 128 blocks).
    assert ctx.prompt_seq_range.values() == [128, 256, 384, 512, 640, 896, 1280, 1664, 2304,
                                             3200, 4352, 6016, 8192]
    assert sorted({b.num_blocks for b in ctx.decode_buckets}) == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 640, 768, 1024, 1408, 1792, 2304, 3072,
        4096]
    assert exponential_range(1, 2, 256, 9) == [1, 2, 4, 8, 14, 24, 42, 78, 140, 256]
    assert exponential_range(0, 1, 64, 7) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert exponential_range(5, 1, 40, 1) == [40]


@pytest.mark.parametrize("bmin", [2, 4, 16, 64])
def test_exponential_decode_block_min_is_the_lowest_bucket(monkeypatch, bmin):
    """Issue 54: a decode block min below the step (block_size blocks) rounded every
    low point up to the step, leaving [128]: a one-sequence decode of 3 blocks ran
    as (1, 1, 128). The min is the lowest bucket, the low end filled up to the step."""
    monkeypatch.setenv("VLLM_DECODE_BLOCK_BUCKET_MIN", str(bmin))
    ctx = _ctx(max_num_seqs=64, max_model_len=4096, num_kv_blocks=2048)
    blocks = sorted({b.num_blocks for b in ctx.decode_buckets})
    assert blocks[0] == bmin and 128 in blocks and blocks[-1] == 2048
    assert all(b >= bmin for b in blocks)
    assert ctx.find_decode_bucket(1, 3) == Bucket(1, 1, max(4, bmin))
    assert ctx.find_decode_bucket(1, 100) == Bucket(1, 1, 128)


def test_exponential_prompt_mins_are_the_lowest_buckets(monkeypatch):
    """VLLM_PROMPT_SEQ_BUCKET_MIN=64 became 128 and VLLM_PROMPT_BS_BUCKET_MIN=3 became 4."""
    monkeypatch.setenv("VLLM_PROMPT_SEQ_BUCKET_MIN", "64")
    monkeypatch.setenv("VLLM_PROMPT_BS_BUCKET_MIN", "3")
    ctx = _ctx(max_num_seqs=64, max_model_len=4096)
    assert ctx.prompt_seq_range.values()[:3] == [64, 128, 256]
    assert ctx.prompt_bs_range.values()[0] == 3
    assert min(b.query_len for b in ctx.prompt_buckets) == 64
    assert min(b.batch_size for b in ctx.prompt_buckets) == 3
    assert ctx.find_prompt_bucket(3, 50) == Bucket(3, 64, 0)
    assert exponential_range(64, 128, 1024, 5) == [64, 128, 256, 384, 640, 1024]
    assert exponential_range(200, 128, 1024, 4) == [200, 384, 640, 1024]


def test_fill_low_end_of_the_decode_blocks():
    from vllm.hpu.bucketing import fill_low_end
    assert fill_low_end([1, 32]) == [1, 2, 4, 8, 16, 32]
    assert fill_low_end([1, 128, 256]) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert fill_low_end([3, 20, 40]) == [3, 4, 8, 16, 20, 40]
    assert fill_low_end([1, 2, 4]) == [1, 2, 4] and fill_low_end([5]) == [5]
    # The limits: max_model_len 512, block 128, 8 sequences.
    ctx = _ctx(max_num_seqs=8, max_model_len=512, num_kv_blocks=32)
    assert sorted({b.num_blocks for b in ctx.decode_buckets}) == [1, 2, 4, 8, 16, 32]
    assert ctx.find_decode_bucket(3, 5) == Bucket(4, 1, 8)


def test_invalid_ranges_raise():
    with pytest.raises(ValueError, match="min"):
        linear_range(8, 4, 2)
    with pytest.raises(ValueError, match="max_num_seqs"):
        _ctx(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_num_prefill_seqs"):
        _ctx(max_num_seqs=4, max_num_prefill_seqs=8)


def test_prompt_filter_and_decode_filters():
    ctx = _ctx(num_kv_blocks=300)
    assert ctx.prompt_buckets
    for b in ctx.prompt_buckets:
        assert b.batch_size * b.query_len <= 8192
        if b.batch_size > 1 and b.num_blocks:
            assert b.batch_size * (b.query_len + b.num_blocks * 128) <= 8192
    # A lone late chunk of a long prompt: query within budget, context up to the model.
    assert Bucket(1, 128, 64) in ctx.prompt_buckets
    # A bucket that would break the budget is absent even though its values exist.
    assert Bucket(64, 256, 0) not in ctx.prompt_buckets and Bucket(64, 128, 0) in ctx.prompt_buckets
    for b in ctx.decode_buckets:
        assert b.query_len == 1 and b.batch_size <= b.num_blocks <= 300
    assert max(b.num_blocks for b in ctx.decode_buckets) == 300  # clamped, not 4096+
    assert Bucket(256, 1, 256) in ctx.decode_buckets
    assert Bucket(140, 1, 128) not in ctx.decode_buckets  # bs > blocks


def test_no_prompt_context_gives_zero_ctx_buckets():
    ctx = _ctx(use_prompt_context=False)
    assert {b.num_blocks for b in ctx.prompt_buckets} == {0}


def test_lookup_smallest_covering_bucket():
    ctx = _ctx(num_kv_blocks=4096)
    assert ctx.find_prompt_bucket(3, 300) == Bucket(4, 384, 0)
    assert ctx.find_prompt_bucket(1, 128, 3) == Bucket(1, 128, 4)
    assert ctx.find_decode_bucket(3, 7) == Bucket(4, 1, 8)
    assert ctx.find_decode_bucket(1, 1) == Bucket(1, 1, 1)
    assert ctx.find_decode_bucket(200, 1000) == Bucket(256, 1, 1024)
    assert not ctx.fallback_buckets


def test_fallback_warns_once_and_adds_one_bucket(caplog):
    """A batch no bucket covers runs in its own shape, unpadded (seed 001: a shape
    outside the buckets is processed without padding), warned once; the bucket
    stays for the batches it covers."""
    ctx = _ctx(num_kv_blocks=4096)
    before = ctx.num_prompt_buckets
    with caplog.at_level(logging.WARNING, logger="vllm"):
        first = ctx.find_prompt_bucket(3, 2100)  # (4, 2304) breaks the token budget
        second = ctx.find_prompt_bucket(3, 2100)
        third = ctx.find_prompt_bucket(3, 2050)
    warnings = [r for r in caplog.records if "was not warmed up" in r.getMessage()]
    assert first == second == third == Bucket(3, 2100, 0)
    assert len(warnings) == 1 and "without padding" in warnings[0].getMessage()
    assert ctx.num_prompt_buckets == before + 1 and ctx.fallback_buckets == [first]


def test_decode_fallback_is_not_padded(monkeypatch):
    """Issue 54: (3, 1, 5) outside the decode buckets ran as (4, 1, 32)."""
    monkeypatch.setenv("VLLM_DECODE_BS_BUCKET_MAX", "2")
    ctx = _ctx(max_num_seqs=8, max_model_len=512, num_kv_blocks=32)
    assert max(b.batch_size for b in ctx.decode_buckets) == 2
    assert ctx.find_decode_bucket(3, 5) == Bucket(3, 1, 5)
    assert ctx.fallback_buckets == [Bucket(3, 1, 5)]


def test_decode_fallback_past_range():
    ctx = _ctx(max_num_seqs=8, num_kv_blocks=64)
    with pytest.raises(ValueError):
        ctx.find_decode_bucket(0, 3)
    bucket = ctx.find_decode_bucket(9, 20)  # more sequences than max_num_seqs
    assert bucket.batch_size >= 9 and bucket.num_blocks >= 20
    assert bucket in ctx.decode_buckets


def test_decode_lookup_requires_generation():
    ctx = _ctx()
    with pytest.raises(ValueError, match="generate_decode_buckets"):
        ctx.find_decode_bucket(1, 1)
    ctx.generate_decode_buckets(100)
    assert ctx.find_decode_bucket(1, 1) == Bucket(1, 1, 1)


def test_env_overrides(monkeypatch):
    monkeypatch.setenv("VLLM_DECODE_BS_BUCKET_MAX", "64")
    monkeypatch.setenv("VLLM_PROMPT_SEQ_BUCKET_MIN", "256")
    monkeypatch.setenv("VLLM_PROMPT_BS_BUCKET_STEP", "4")
    ctx = _ctx(num_kv_blocks=1024)
    assert ctx.decode_bs_range.values() == [1, 2, 4, 8, 12, 22, 36, 64]
    assert ctx.prompt_seq_range.values()[0] == 256
    assert ctx.prompt_bs_range.step == 4


def test_linear_mode_env_and_defaults(monkeypatch):
    monkeypatch.setenv("VLLM_EXPONENTIAL_BUCKETING", "false")
    ctx = _ctx(max_num_seqs=64, max_model_len=1024, max_num_batched_tokens=2048,
               num_kv_blocks=1000)
    assert not ctx.exponential
    assert ctx.prompt_bs_range.values() == [1, 2, 4, 8, 16, 32, 64]
    assert ctx.prompt_seq_range.values() == [128, 256, 384, 512, 640, 768, 896, 1024]
    assert ctx.decode_bs_range.values() == [1, 2, 4, 8, 16, 32, 64]
    assert ctx.decode_block_range.as_list() == [128, 128, 512]


def test_invalid_env_names_the_variable(monkeypatch):
    monkeypatch.setenv("VLLM_DECODE_BS_BUCKET_MIN", "0")
    with pytest.raises(ValueError, match="VLLM_DECODE_BS_BUCKET_MIN"):
        _ctx(num_kv_blocks=100)


def test_log_lines(caplog):
    with caplog.at_level(logging.INFO, logger="vllm"):
        ctx = _ctx(num_kv_blocks=512)
    text = caplog.text
    assert "Prompt bucket config (min, step, max_warmup) bs:[1, 2, 64], seq:[128, 128, 8192]" \
        in text
    assert f"Generated {ctx.num_prompt_buckets} prompt buckets: [(1, 128, 0), " in text
    assert "Decode bucket config (min, step, max_warmup) bs:[1, 2, 256]" in text
    assert f"Generated {ctx.num_decode_buckets} decode buckets: [(1, 1, 1), " in text


@pytest.mark.parametrize("budget,max_len,exponential", [
    (256, 1024, True), (256, 1024, False), (512, 512, True), (384, 2048, True),
    (8192, 2048, False)])
def test_every_reachable_lone_chunk_has_a_bucket(budget, max_len, exponential):
    """Any chunk (query <= budget) after any context that fits max_model_len is warmed.

    This is what chunked prefill produces: later chunks have a small query and a
    large context, which a filter on bs * (query + context) would have dropped.
    """
    ctx = _ctx(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=max_len,
               exponential=exponential)
    for context in range(0, max_len, 37):
        for query in range(1, min(budget, max_len - context) + 1, 29):
            blocks = -(-context // 128)
            assert ctx.covering_prompt_bucket(1, query, blocks) is not None, (query, context)
    assert not ctx.fallback_buckets


def test_covering_bucket_has_no_side_effects():
    ctx = _ctx(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1024)
    before = list(ctx.prompt_buckets)
    assert ctx.covering_prompt_bucket(2, 300) is None  # 2 * 384 > 512
    assert ctx.covering_prompt_bucket(2, 200) == Bucket(2, 256, 0)
    assert ctx.prompt_buckets == before and not ctx.fallback_buckets


def test_contiguous_pa_decode_blocks_reach_the_cache_size():
    plain = _ctx(max_num_seqs=4, max_model_len=512, num_kv_blocks=1000)
    contiguous = _ctx(max_num_seqs=4, max_model_len=512, num_kv_blocks=1000,
                      contiguous_pa=True)
    assert max(b.num_blocks for b in plain.decode_buckets) == 128
    assert max(b.num_blocks for b in contiguous.decode_buckets) == 1000
    assert contiguous.find_decode_bucket(1, 999).num_blocks == 1000
