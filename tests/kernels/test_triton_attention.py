"""The Triton paged-attention ops (CUDA backend) against a float64 reference, run on
CPU through Triton's interpreter (the same kernel code a GPU compiles).

Every step writes its sequences' K/V with `reshape_and_cache`, then attends with
`unified_attention`; the reference gathers each sequence's K/V from the cache
through the block table and applies an explicit masked softmax. Unused block-table
entries point at a block full of NaN, so any read past a sequence's length shows.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import pytest
import torch

from vllm.attention.fp8_kv import quantize_kv
from vllm.attention.ops import triton_reshape_and_cache as rac_mod
from vllm.attention.ops.triton_reshape_and_cache import HAS_TRITON, reshape_and_cache

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

if HAS_TRITON:
    from vllm.attention.ops.triton_unified_attention import (AttentionLaunch,
                                                             plan_launch,
                                                             run_unified_attention,
                                                             unified_attention)

DEVICE = os.environ.get("VLLM_TEST_TRITON_DEVICE", "cpu")
"""Where the attention cases run: the CPU (interpreter), or "cuda" on a GPU machine
(benchmarks/cuda_acceptance.py sets it); the reference always runs on the CPU."""

SENTINEL = 123.0
POISON_BLOCK = 0


@dataclass
class Step:
    """One batch: query rows of each sequence, its paged cache and block table."""
    query: torch.Tensor
    kv_cache: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    block_size: int


def make_step(seqs: Sequence[Tuple[int, int]], num_heads: int, num_kv_heads: int,
              head_size: int, block_size: int = 4, pad_rows: int = 0,
              dtype: torch.dtype = torch.float32,
              cache_dtype: Optional[torch.dtype] = None, k_scale: float = 1.0,
              v_scale: float = 1.0, seed: int = 0) -> Step:
    """seqs: (context_len, query_len) per sequence; (0, 0) is a padding sequence."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in seqs]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    max_blocks = max(blocks_per_seq) + 1  # an unused column in every row
    num_blocks = sum(blocks_per_seq) + 1
    cache = torch.full((2, num_kv_heads, num_blocks * block_size, head_size),
                       float("nan"), dtype=torch.float32).to(cache_dtype or dtype)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.full((len(seqs), max_blocks), POISON_BLOCK, dtype=torch.int32)
    for s, n in enumerate(blocks_per_seq):
        table[s, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    for s, length in enumerate(seq_lens):
        if length == 0:
            continue
        pos = torch.arange(length)
        slots = table[s, pos // block_size].long() * block_size + pos % block_size
        k = torch.randn(length, num_kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(length, num_kv_heads, head_size, generator=gen).to(dtype)
        reshape_and_cache(k, v, cache, slots, k_scale, v_scale)
    num_rows = sum(q for _, q in seqs) + pad_rows
    query = torch.randn(num_rows, num_heads, head_size, generator=gen).to(dtype)
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor([q for _, q in seqs]), 0)
    return Step(query.to(DEVICE), cache.to(DEVICE), qsl.to(DEVICE),
                torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
                table.to(DEVICE), block_size)


def reference(step: Step, scale: float, sliding_window: Optional[int] = None,
              softcap: Optional[float] = None,
              alibi_slopes: Optional[torch.Tensor] = None,
              k_scale: float = 1.0, v_scale: float = 1.0,
              sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float64 attention of every sequence's rows over its dequantized cache; `sinks`
    [heads]: one more logit per head in the softmax denominator (its column dropped)."""
    step = Step(step.query.cpu(), step.kv_cache.cpu(), step.query_start_loc.cpu(),
                step.seq_lens.cpu(), step.block_table.cpu(), step.block_size)
    q_all = step.query.double()
    num_heads = q_all.shape[1]
    out = torch.full_like(q_all, SENTINEL)
    bs = step.block_size
    for s in range(len(step.seq_lens)):
        q0, q1 = int(step.query_start_loc[s]), int(step.query_start_loc[s + 1])
        length, n = int(step.seq_lens[s]), q1 - q0
        if n == 0:
            continue
        pos = torch.arange(length)
        slots = step.block_table[s, pos // bs].long() * bs + pos % bs
        k = step.kv_cache[0][:, slots].double() * k_scale
        v = step.kv_cache[1][:, slots].double() * v_scale
        group = num_heads // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = q_all[q0:q1].transpose(0, 1) @ k.transpose(1, 2) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = (length - n + torch.arange(n))[:, None]
        k_pos = pos[None, :]
        if alibi_slopes is not None:
            scores = scores + alibi_slopes.double().cpu()[:, None, None] * (k_pos - q_pos)
        allowed = k_pos <= q_pos
        if sliding_window:
            allowed &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double().cpu().view(-1, 1, 1).expand(num_heads, n, 1)
            probs = torch.cat((scores, sink), -1).softmax(-1)[..., :-1]
        out[q0:q1] = (probs @ v).transpose(0, 1)
    return out


def run(step: Step, launch: Optional["AttentionLaunch"] = None,
        **kwargs) -> torch.Tensor:
    out = torch.full_like(step.query, SENTINEL)
    args = (step.query, step.kv_cache, out, step.query_start_loc, step.seq_lens,
            step.block_table, step.block_size, kwargs.pop("scale"))
    if launch is None:
        unified_attention(*args, **kwargs)
    else:
        run_unified_attention(*args, launch, **kwargs)
    return out.cpu()


def check(step: Step, atol: float = 2e-5, launch=None, **kwargs) -> None:
    ref = reference(step, **kwargs)
    got = run(step, launch, **kwargs)
    valid = int(step.query_start_loc[-1])
    torch.testing.assert_close(got[:valid].double(), ref[:valid], atol=atol, rtol=atol)
    # Rows past the last sequence belong to no one: left exactly as they were.
    assert torch.all(got[valid:] == SENTINEL)


# Small tiles: several key tiles per sequence, so tile skipping and the online
# softmax across tiles are exercised on tiny sequences; and the split-KV path.
SMALL = AttentionLaunch(block_m=16, block_q=4, tile=16, num_segments=1, num_warps=4,
                        num_stages=2) if HAS_TRITON else None
PREFILL = AttentionLaunch(block_m=128, block_q=64, tile=32, num_segments=1,
                          num_warps=8, num_stages=3) if HAS_TRITON else None
"""The tiles a GPU plans for bfloat16 prefills (here with 2 query heads per KV head)."""
SPLIT = AttentionLaunch(block_m=16, block_q=4, tile=16, num_segments=4, num_warps=4,
                        num_stages=2) if HAS_TRITON else None

MIXED = [(20, 1), (0, 1), (0, 0), (0, 9), (6, 5), (37, 1), (0, 0)]
"""Decodes (one with an empty context), padding sequences, a whole prompt and a
chunk with a cached prefix of 6 (not a multiple of the block size)."""


@pytest.mark.parametrize("seqs", [
    [(5, 1), (17, 1), (0, 1)],
    [(0, 7), (0, 12)],
    [(6, 5), (13, 9)],
], ids=["decodes", "prefills", "chunked"])
def test_batch_kinds(seqs):
    step = make_step(seqs, num_heads=4, num_kv_heads=2, head_size=64, pad_rows=2)
    check(step, launch=SMALL, scale=64 ** -0.5)
    check(step, scale=64 ** -0.5)  # the planned tiles
    check(step, launch=PREFILL, scale=64 ** -0.5)


@pytest.mark.parametrize("heads,head_size", [((8, 2), 80), ((2, 2), 64), ((3, 1), 8)],
                         ids=["gqa-80", "mha-64", "mqa-8"])
def test_mixed_batch(heads, head_size):
    step = make_step(MIXED, *heads, head_size=head_size, block_size=8, pad_rows=3)
    check(step, launch=SMALL, scale=head_size ** -0.5)


def test_planned_launch_and_split_kv_agree_with_reference():
    step = make_step(MIXED, 8, 2, 64, pad_rows=3, seed=1)
    check(step, scale=0.125)
    check(step, launch=SPLIT, scale=0.125)


def test_sliding_window_skips_and_masks_old_keys():
    step = make_step(MIXED, 4, 2, 64, pad_rows=1, seed=2)
    check(step, launch=SMALL, scale=0.125, sliding_window=5)
    check(step, launch=SPLIT, scale=0.125, sliding_window=19)


def test_softcap_and_alibi():
    step = make_step(MIXED, 4, 2, 64, pad_rows=1, seed=3)
    check(step, launch=SMALL, scale=1.0, softcap=5.0)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    check(step, launch=SMALL, scale=0.125, alibi_slopes=slopes)


def test_attention_sinks():
    """GPT-OSS's per-head sink logits, alone and with a window, in one segment and
    split over four (the sink counted once)."""
    step = make_step(MIXED, 4, 2, 64, pad_rows=1, seed=6)
    sinks = torch.tensor([2.5, -1.0, 0.3, 4.0], device=DEVICE)
    check(step, launch=SMALL, scale=0.125, sinks=sinks)
    check(step, launch=SPLIT, scale=0.125, sinks=sinks)
    check(step, launch=SMALL, scale=0.125, sinks=sinks, sliding_window=3)
    check(step, launch=SPLIT, scale=0.125, sinks=sinks, sliding_window=19)


def test_fp8_cache_with_scales():
    ks, vs = 0.05, 1.7
    step = make_step(MIXED, 4, 2, 64, pad_rows=1, cache_dtype=torch.float8_e4m3fn,
                     k_scale=ks, v_scale=vs, seed=4)
    assert step.kv_cache.dtype == torch.float8_e4m3fn
    check(step, launch=SMALL, scale=0.125, k_scale=ks, v_scale=vs)


def test_bfloat16():
    step = make_step(MIXED, 8, 2, 64, pad_rows=1, dtype=torch.bfloat16, seed=5)
    got = run(step, SMALL, scale=0.125)
    assert got.dtype == torch.bfloat16
    ref = reference(step, scale=0.125)
    valid = int(step.query_start_loc[-1])
    torch.testing.assert_close(got[:valid].double(), ref[:valid], atol=2e-2, rtol=2e-2)
    assert torch.all(got[valid:] == SENTINEL)


def test_plan_depends_on_shapes_only():
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    decode = plan_launch(4, 4, 8, 2, 128, 64, 16, bf16, cpu)
    assert decode.block_m == 16 and decode.block_q == 4
    prefill = plan_launch(512, 4, 8, 2, 256, 64, 16, bf16, cpu)
    assert prefill.block_m == 64 and prefill.tile == 32
    # Enough programs for every row of every sequence, whatever the split.
    for lens in ([1] * 4, [509, 1, 1, 1], [0, 0, 0, 512]):
        blocks = sum(-(-n // prefill.block_q) for n in lens)
        assert blocks <= prefill.num_q_blocks(512, 4)


def test_small_grids_split_the_keys(monkeypatch):
    from vllm.attention.ops import triton_unified_attention as ua
    monkeypatch.setattr(ua, "_num_sms", lambda device: 132)
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    batch1 = plan_launch(1, 1, 32, 8, 128, 512, 16, bf16, cpu)
    assert batch1.num_segments == 32
    short_cache = plan_launch(1, 1, 32, 8, 128, 2, 16, bf16, cpu)
    assert short_cache.num_segments == 1
    prefill = plan_launch(64 * 128, 64, 32, 8, 128, 512, 16, bf16, cpu)
    assert prefill.num_segments == 1 and prefill.block_m == 128


_TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                 torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
                 torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}


class _Recorder:
    """Stands in for a kernel: records each launch's arguments instead of running."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def on(self, device):
        return self

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel.fn, args, kwargs))


def _compile_for_sm90(fn, args, kwargs):
    """What the CUDA JIT would do with these arguments, without a GPU: the front end
    and the sm_90 back end catch what the interpreter accepts but a GPU rejects."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(inspect.signature(fn).parameters)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    signature = {}
    for name, value in zip(names, args):
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[value.dtype]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
    signature.update({name: "constexpr" for name in kwargs})
    triton.compile(ASTSource(triton.jit(fn), signature, kwargs),
                   target=GPUTarget("cuda", 90, 32), options=options)


def test_launches_compile_for_sm90(monkeypatch):
    """The CI has no GPU: compile every kernel the ops launch for a decode step (bf16,
    split keys, all features, fp8 cache) and a prefill step, ahead of time."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    # After an interpreted run in the same process (a GPU machine's CPU tests): the
    # interpreter must have put Triton's language back for the compiler.
    check(make_step([(3, 2)], 2, 1, 64), launch=SPLIT, scale=0.125, softcap=5.0)
    from vllm.attention.ops import triton_unified_attention as ua
    recorders = {name: _Recorder(getattr(mod, name)) for mod, name in (
        (ua, "_ATTENTION"), (ua, "_COMBINE"), (rac_mod, "_KERNEL"))}
    for name, mod in (("_ATTENTION", ua), ("_COMBINE", ua), ("_KERNEL", rac_mod)):
        monkeypatch.setattr(mod, name, recorders[name])
    monkeypatch.setattr(ua, "_num_sms", lambda device: 132)
    for num_tokens, cache_dtype in ((2, torch.float8_e4m3fn), (300, torch.bfloat16)):
        query = torch.zeros(num_tokens, 8, 80, dtype=torch.bfloat16)
        cache = torch.zeros(2, 2, 64, 80, dtype=cache_dtype)
        qsl = torch.tensor([0, num_tokens - 1, num_tokens], dtype=torch.int32)
        reshape_and_cache(query[:, :2], query[:, 2:4], cache,
                          torch.zeros(num_tokens, dtype=torch.int64), 0.5, 2.0)
        unified_attention(query, cache, query.clone(), qsl,
                          torch.tensor([40, 1], dtype=torch.int32),
                          torch.zeros(2, 16, dtype=torch.int32), 16, 0.1,
                          sliding_window=32, softcap=30.0, alibi_slopes=torch.ones(8),
                          k_scale=0.5, v_scale=2.0, sinks=torch.zeros(8))
    launches = [launch for r in recorders.values() for launch in r.launches]
    assert recorders["_COMBINE"].launches  # few programs: the keys were split
    for fn, args, kwargs in launches:
        _compile_for_sm90(fn, args, dict(kwargs))


def _fused_qkv(num_tokens: int, num_kv_heads: int, head_size: int, dtype):
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_size).to(dtype)
    split = qkv.view(num_tokens, 3, num_kv_heads, head_size)
    return split[:, 1], split[:, 2]  # strided views of the fused output


@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn, torch.float8_e5m2])
def test_reshape_and_cache(cache_dtype):
    torch.manual_seed(0)
    key, value = _fused_qkv(6, 2, 80, torch.float32)
    assert not key.is_contiguous()
    key = key * 30.0  # some rows saturate fp8 e4m3 after the scale
    dtype = cache_dtype or torch.float32
    cache = torch.zeros(2, 2, 16, 80, dtype=dtype)
    slots = torch.tensor([3, -1, 15, 0, -1, 7], dtype=torch.int32)
    reshape_and_cache(key, value, cache, slots, k_scale=0.5, v_scale=2.0)
    kept = slots >= 0
    written = torch.zeros(16, dtype=torch.bool)
    written[slots[kept].long()] = True
    for i, (x, scale) in enumerate(((key, 0.5), (value, 2.0))):
        rows = cache[i][:, slots[kept].long()].transpose(0, 1)
        want = x[kept] if cache_dtype is None else quantize_kv(x[kept], scale, dtype)
        assert torch.equal(rows.view(torch.uint8) if cache_dtype else rows,
                           want.view(torch.uint8) if cache_dtype else want)
        # Skipped rows wrote nothing: every other slot still holds zeros.
        assert torch.all(cache[i][:, ~written].float() == 0)


def test_reshape_and_cache_bfloat16_int64_slots():
    key, value = _fused_qkv(3, 1, 64, torch.bfloat16)
    cache = torch.zeros(2, 1, 8, 64, dtype=torch.bfloat16)
    reshape_and_cache(key, value, cache, torch.tensor([5, 2, -7]))
    assert torch.equal(cache[0, 0, [5, 2]], key[:2, 0])
    assert torch.equal(cache[1, 0, [5, 2]], value[:2, 0])
    assert torch.all(cache[:, :, [0, 1, 3, 4, 6, 7]] == 0)


def test_ops_refuse_to_run_without_triton(monkeypatch):
    monkeypatch.setattr(rac_mod, "HAS_TRITON", False)
    key = torch.zeros(1, 1, 64)
    with pytest.raises(RuntimeError, match="triton"):
        reshape_and_cache(key, key, torch.zeros(2, 1, 4, 64), torch.zeros(1).long())
    with pytest.raises(RuntimeError, match="triton"):
        unified_attention(key, torch.zeros(2, 1, 4, 64), key, torch.tensor([0, 1]),
                          torch.tensor([1]), torch.zeros(1, 1, dtype=torch.int32), 4,
                          1.0)
