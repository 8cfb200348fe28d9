"""Pieces of the HPU runner without a model: padding, grouping, capture planning, memory."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.hpu.attention import HPUAttentionImpl, HPUKVCache
from vllm.hpu.bucketing import Bucket
from vllm.hpu.compile_tracker import CompileTracker
from vllm.hpu.execution import ExecutionMode
from vllm.hpu.input_prep import (DecodeSeq, PromptSeq, build_decode_batch,
                                        build_prompt_batch, decode_blocks_needed,
                                        dependency_levels)
from vllm.hpu.prompt_grouping import greedy_group_prompts, group_prompts
from vllm.hpu.model_runner import resolve_contiguous_pa
from vllm.hpu.profiler import HPUProfiler
from vllm.hpu.warmup import (bucket_tokens, capture_within_budget, format_bytes,
                                    order_for_capture)
from vllm.hpu.worker import HPUMemoryBudget

BS = 4
NUM_BLOCKS = 12  # the pad block is block 12
PAD = NUM_BLOCKS
LAYER = SimpleNamespace(num_heads=4, num_kv_heads=2, head_size=8, scale=8 ** -0.5)


def _prompt_seq(req: str, table: list[int], context: int, n: int) -> PromptSeq:
    pos = np.arange(context, context + n)
    slots = np.asarray(table)[pos // BS] * BS + pos % BS
    return PromptSeq(req, np.arange(n) + 1, pos, slots, context, table[:-(-context // BS)],
                     sample=True)


def _decode_seq(req: str, table: list[int], seq_len: int) -> DecodeSeq:
    p = seq_len - 1
    return DecodeSeq(req, 7, p, table[p // BS] * BS + p % BS, seq_len, table[:-(-seq_len // BS)])


def _cache(seed: int) -> HPUKVCache:
    g = torch.Generator().manual_seed(seed)
    return HPUKVCache(*torch.randn(2, (NUM_BLOCKS + 1) * BS, LAYER.num_kv_heads,
                                   LAYER.head_size, generator=g).unbind(0))


def _qkv(rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, h * LAYER.head_size, generator=g)
                 for h in (LAYER.num_heads, LAYER.num_kv_heads, LAYER.num_kv_heads))


def _run(batch, cache, real_qkv, seed: int):
    """Attention with real rows from `real_qkv` and random (finite) padding rows."""
    rows = batch.input_ids.shape[0]
    q, k, v = _qkv(rows, seed)
    stride = batch.row_stride
    for i, seq in enumerate(batch.seqs):
        n = seq.query_len if batch.is_prompt else 1
        for t, src in zip((q, k, v), real_qkv):
            t[i * stride:i * stride + n] = src[i][:n]
    out = HPUAttentionImpl().forward(LAYER, q, k, v, cache, batch.attn_metadata)
    return [out[i * stride:i * stride + (seq.query_len if batch.is_prompt else 1)]
            for i, seq in enumerate(batch.seqs)]


@pytest.mark.parametrize("context", [0, 6])
def test_prompt_padding_never_changes_real_rows(context):
    seqs = [_prompt_seq("a", [3, 5, 1], context, 5), _prompt_seq("b", [8, 2, 9], context, 3)]
    ctx_blocks = -(-context // BS)
    real = [_qkv(8, 100 + i) for i in range(2)]
    real_qkv = [[r[j] for r in real] for j in range(3)]
    small = build_prompt_batch(seqs, Bucket(2, 8, ctx_blocks), BS, PAD, torch.device("cpu"))
    big = build_prompt_batch(seqs, Bucket(4, 16, ctx_blocks + 2), BS, PAD, torch.device("cpu"))
    cache_small, cache_big = _cache(0), _cache(0)
    out_small = _run(small, cache_small, real_qkv, seed=1)
    out_big = _run(big, cache_big, real_qkv, seed=2)
    for a, b in zip(out_small, out_big):
        torch.testing.assert_close(a, b)
    # Padding wrote only into the pad block; real slots hold the same K/V.
    pad = slice(PAD * BS, (PAD + 1) * BS)
    for half_small, half_big, half_fresh in zip(cache_small, cache_big, _cache(0)):
        torch.testing.assert_close(half_small[:pad.start], half_big[:pad.start])
        assert not torch.equal(half_big[pad], half_fresh[pad])
    assert big.logits_indices.tolist() == [4, 16 + 2, 32, 48]
    assert big.input_ids.view(4, 16)[0, 5:].eq(0).all()  # right-padded with 0
    assert big.positions.view(4, 16)[2:].eq(0).all()


@pytest.mark.parametrize("contiguous", [False, True])
def test_decode_padding_never_changes_real_rows(contiguous):
    seqs = [_decode_seq("a", [3, 5, 1], 10), _decode_seq("b", [8], 2)]
    need = decode_blocks_needed(seqs, BS, contiguous)
    assert need == (9 if contiguous else 4)
    real_qkv = [[t[i:i + 1] for i in range(2)] for t in _qkv(2, 5)]
    outs = []
    for bucket, seed in ((Bucket(2, 1, need), 1), (Bucket(4, 1, NUM_BLOCKS), 2)):
        batch = build_decode_batch(seqs, bucket, BS, PAD, contiguous, torch.float32,
                                   torch.device("cpu"))
        outs.append(_run(batch, _cache(3), real_qkv, seed))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)


def test_group_prompts_stays_inside_buckets():
    buckets = {Bucket(1, 8, 0), Bucket(1, 16, 0), Bucket(2, 8, 0), Bucket(1, 8, 2)}

    def covering(b, q, c):
        fits = [x for x in buckets if x.batch_size >= b and x.query_len >= q and x.num_blocks >= c]
        return min(fits) if fits else None

    seqs = [_prompt_seq(str(i), [0, 1, 2, 3], ctx, n)
            for i, (ctx, n) in enumerate([(0, 3), (0, 12), (0, 5), (4, 2), (0, 7)])]
    for split in (group_prompts, greedy_group_prompts):
        groups = split(seqs, covering, BS, 0)
        assert sorted(s.req_id for g in groups for s in g) == ["0", "1", "2", "3", "4"]
        for g in groups:
            assert covering(len(g), max(s.query_len for s in g),
                            max(s.num_context_blocks for s in g)) is not None
        assert groups[0][0].req_id == "3"  # context first, then longest query
    assert [len(g) for g in greedy_group_prompts(seqs, covering)] == [1, 1, 2, 1]


def test_dependency_levels_put_writers_first():
    writer = _prompt_seq("w", [4, 5, 6], 0, 12)           # writes blocks 4, 5, 6
    reader = _prompt_seq("r", [4, 5, 9], 8, 2)            # reads 4, 5 from this step
    free = _prompt_seq("f", [7], 0, 3)
    chained = _prompt_seq("c", [4, 5, 9, 10], 12, 3)      # reads 9, written by the reader
    levels = dependency_levels([reader, chained, free, writer], BS)
    assert [[s.req_id for s in lv] for lv in levels] == [["f", "w"], ["r"], ["c"]]
    assert dependency_levels([], BS) == []


def test_capture_within_budget_estimates_and_skips():
    buckets = [Bucket(1, 128, 0), Bucket(2, 128, 0), Bucket(4, 128, 0), Bucket(1, 512, 0)]
    taken = []

    def capture(b):
        taken.append(b)
        return 10 * bucket_tokens(True, b)

    res = capture_within_budget(buckets, 5000, lambda b: bucket_tokens(True, b), capture)
    # 1280 + 2560 = 3840 used; (4, 128) would need 5120 more; (1, 512) 5120 too.
    assert res.captured == taken == buckets[:2]
    assert res.skipped == buckets[2:] and res.used_bytes == 3840 and res.left_bytes == 1160
    assert res.bytes_per_token == 10
    again = capture_within_budget(res.skipped, 6000, lambda b: bucket_tokens(True, b), capture,
                                  bytes_per_token=res.bytes_per_token)
    assert again.captured == [Bucket(4, 128, 0)] and again.skipped == [Bucket(1, 512, 0)]
    none = capture_within_budget(buckets, 0, lambda b: 1, capture)
    assert none.captured == [] and none.skipped == buckets


def test_capture_orders():
    prompt = [Bucket(4, 128, 0), Bucket(1, 256, 0), Bucket(2, 128, 1), Bucket(1, 128, 0)]
    assert order_for_capture(prompt, True, "min_tokens") == [
        Bucket(1, 128, 0), Bucket(1, 256, 0), Bucket(2, 128, 1), Bucket(4, 128, 0)]
    assert order_for_capture(prompt, True, "max_bs")[0] == Bucket(4, 128, 0)
    decode = [Bucket(1, 1, 8), Bucket(8, 1, 64), Bucket(2, 1, 8)]
    assert order_for_capture(decode, False, "max_bs") == [
        Bucket(8, 1, 64), Bucket(2, 1, 8), Bucket(1, 1, 8)]
    # decode min_tokens: bs x blocks ascending (not by batch size alone)
    decode = [Bucket(2, 1, 16), Bucket(4, 1, 4), Bucket(3, 1, 4), Bucket(1, 1, 64)]
    assert order_for_capture(decode, False, "min_tokens") == [
        Bucket(3, 1, 4), Bucket(4, 1, 4), Bucket(2, 1, 16), Bucket(1, 1, 64)]
    with pytest.raises(ValueError, match="VLLM_GRAPH_DECODE_STRATEGY"):
        order_for_capture(decode, False, "biggest")


def test_memory_budget_formula():
    b = HPUMemoryBudget.plan(free=100 << 30, gpu_memory_utilization=0.9, graph_reserved_mem=0.1)
    assert b.usable == int(0.9 * (100 << 30))
    assert b.kv_cache == int(b.usable * 0.9) and b.graph_reserved == b.usable - b.kv_cache
    assert b.margin == (100 << 30) - b.usable
    assert HPUMemoryBudget.plan(1000, 1.0, 0.0).kv_cache == 1000
    with pytest.raises(ValueError, match="VLLM_GRAPH_RESERVED_MEM"):
        HPUMemoryBudget.plan(1000, 0.9, 1.0)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        HPUMemoryBudget.plan(1000, 0.0, 0.1)
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(3 << 30) == "3 GiB"


def test_execution_mode_table():
    assert ExecutionMode.select(lazy=True, enforce_eager=False) is ExecutionMode.HPU_GRAPHS
    assert ExecutionMode.select(lazy=True, enforce_eager=True) is ExecutionMode.LAZY
    assert ExecutionMode.select(lazy=False, enforce_eager=False) is ExecutionMode.TORCH_COMPILE
    assert ExecutionMode.select(lazy=False, enforce_eager=True) is ExecutionMode.EAGER


def test_contiguous_pa_needs_prefix_caching_off(monkeypatch, caplog):
    monkeypatch.delenv("VLLM_CONTIGUOUS_PA", raising=False)
    assert resolve_contiguous_pa(enable_prefix_caching=False)
    assert not resolve_contiguous_pa(enable_prefix_caching=True)
    monkeypatch.setenv("VLLM_CONTIGUOUS_PA", "1")
    with caplog.at_level(logging.WARNING, logger="vllm"):
        assert not resolve_contiguous_pa(enable_prefix_caching=True)
    assert "VLLM_CONTIGUOUS_PA is ignored" in caplog.text
    monkeypatch.setenv("VLLM_CONTIGUOUS_PA", "0")
    assert not resolve_contiguous_pa(enable_prefix_caching=False)


def test_compile_tracker_counts_new_signatures_and_logs(monkeypatch, caplog):
    monkeypatch.setenv("VLLM_HPU_LOG_STEP_GRAPH_COMPILATION", "1")
    tracker = CompileTracker()
    with tracker.track_pass("prompt (1, 8, 0)", ("sig", 1)):
        pass
    tracker.finish_warmup()
    with caplog.at_level(logging.INFO, logger="vllm"):
        for sig in (("sig", 1), ("sig", 2), ("sig", 2)):
            with tracker.track_pass("decode", sig):
                pass
            tracker.end_step()
        with tracker.track_pass("graph replay", None):
            pass
        tracker.end_step()
    assert tracker.stats() == {"num_compiles_warmup": 1, "num_compiles_after_warmup": 1,
                               "num_cpu_fallbacks": None, "num_steps": 4}
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Step")]
    assert steps == ["Step 2: 1 graph compilation(s) [decode: 1]; 1 since warmup."]
    other = CompileTracker()  # another runner: its own signatures
    with other.track_pass("decode", ("sig", 2)):
        pass
    assert other.num_compiles_warmup == 1


def test_profiler_writes_a_chrome_trace(tmp_path):
    path = tmp_path / "trace.json"
    prof = HPUProfiler(enabled=True, path=str(path))
    with prof.record("prompt", bucket=(1, 128, 0)):
        pass
    assert prof.flush() == str(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert events[0]["name"] == "prompt" and events[0]["ph"] == "X"
    assert events[0]["args"]["bucket"] == [1, 128, 0] and events[0]["dur"] >= 0
    off = HPUProfiler(enabled=False, path=str(tmp_path / "none.json"))
    with off.record("x"):
        pass
    assert off.flush() is None and not (tmp_path / "none.json").exists()

