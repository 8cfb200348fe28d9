"""The blocked prefill attention kernel (vllm/cpu/prefill_ops.cpp) against a float64
naive reference: ragged query lengths and tails of both tile sizes, contexts from prefix
hits or earlier chunks, GQA, head sizes 64 / 128 / 80, float32 and bf16, a shuffled
block table, strided query rows. bf16 runs every kernel the library has: float32 FMAs,
and where the CPU allows AVX512-BF16 dot products and AMX tiles."""
from __future__ import annotations

import math
import os

import pytest
import torch

from vllm.cpu import prefill_ops

pytestmark = pytest.mark.skipif(prefill_ops.get_prefill_lib() is None,
                                reason="native prefill kernel unavailable")

BLOCK = 16


def _reference(q: torch.Tensor, cache: torch.Tensor, table: list[list[int]],
               starts: list[int], lens: list[int], ctxs: list[int], hq: int,
               scale: float) -> torch.Tensor:
    """Plain float64 softmax(q k^T * scale, causal) v per sequence and head."""
    _, hkv, _, d = cache.shape
    out = torch.zeros(q.shape[0], hq * d, dtype=torch.float64)
    for blocks, s, n, c in zip(table, starts, lens, ctxs):
        pos = torch.arange(c + n)
        slots = torch.tensor(blocks)[pos // BLOCK] * BLOCK + pos % BLOCK
        k = cache[0][:, slots].double()
        v = cache[1][:, slots].double()
        for h in range(hq):
            kh = h // (hq // hkv)
            qh = q[s:s + n, h * d:(h + 1) * d].double()
            scores = qh @ k[kh].T * scale
            causal = pos[None, :] > (c + torch.arange(n))[:, None]
            scores = scores.masked_fill(causal, -math.inf)
            out[s:s + n, h * d:(h + 1) * d] = torch.softmax(scores, -1) @ v[kh]
    return out


def _case(dtype, hq, hkv, d, lens, ctxs, seed=0):
    g = torch.Generator().manual_seed(seed)
    need = [-(-(c + n) // BLOCK) for n, c in zip(lens, ctxs)]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    table, used = [], 0
    for k in need:
        table.append(perm[used:used + k])
        used += k
    cache = torch.randn(2, hkv, num_blocks * BLOCK, d, generator=g).to(dtype)
    total = sum(lens)
    # q as a strided view into a wider fused projection (q | k | v), as in the models
    qkv = torch.randn(total, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q = qkv[:, :hq * d]
    width = max(need)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, blocks in enumerate(table):
        bt[i, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    return q, cache, table, bt, starts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(6, 2, 64), (4, 4, 128), (3, 1, 80)])
def test_matches_float64_reference(dtype, hq, hkv, d):
    # lengths: a single token, tails of 16-row and 32-key tiles, a 2-tile prompt;
    # contexts: none, a block-aligned prefix hit, an unaligned earlier chunk
    lens = [1, 17, 33, 40, 5]
    ctxs = [0, 0, 32, 7, 45]
    q, cache, table, bt, starts = _case(dtype, hq, hkv, d, lens, ctxs)
    scale = d ** -0.5
    out = torch.full((q.shape[0] + 2, hq * d), 7.0, dtype=dtype)
    prefill_ops.prefill_attention(
        q, cache, bt, torch.tensor(starts, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32), torch.tensor(ctxs, dtype=torch.int32),
        hq, BLOCK, scale, out)
    ref = _reference(q, cache, table, starts, lens, ctxs, hq, scale)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=8e-3, rtol=8e-3)
    torch.testing.assert_close(out[:q.shape[0]].double(), ref, **tol)
    assert (out[q.shape[0]:] == 7.0).all()  # rows of no sequence are left alone


BF16_KERNELS = [prefill_ops.FMA, prefill_ops.DOT, prefill_ops.AMX]


def _run(q, cache, bt, starts, lens, ctxs, hq, scale, kernel, out=None):
    out = torch.empty(q.shape[0], hq * cache.shape[-1], dtype=q.dtype) if out is None else out
    ints = [torch.tensor(x, dtype=torch.int32) for x in (starts, lens, ctxs)]
    prefill_ops.prefill_attention(q, cache, bt, *ints, hq, BLOCK, scale, out, kernel)
    return out


@pytest.mark.parametrize("kernel", BF16_KERNELS)
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (6, 2, 128), (3, 1, 96)])
def test_bf16_kernels_match_float64_reference(kernel, hq, hkv, d):
    """Each bf16 kernel: causal, several sequences in one call, contexts of earlier chunks
    that end mid-block (7, 45, 19, 140), GQA with 3 query heads per KV head, tails of
    16-row query tiles and 32-key tiles, rows that see several of the AMX path's
    128-key blocks. The bf16-product kernels round each probability to
    bf16 (relative error <= 2^-9) before P.V, so their error per element is bounded by
    the output's own rounding (2^-9 relative) plus 2^-9 of the largest |v|; the mean
    error stays near the output rounding's. A kernel this CPU lacks runs the best one
    below it."""
    if kernel > prefill_ops.best_bf16_kernel():
        pytest.skip(f"bf16 kernel {kernel} not available here")
    lens = [1, 17, 33, 40, 5, 70, 150]
    ctxs = [0, 0, 32, 7, 45, 19, 140]
    q, cache, table, bt, starts = _case(torch.bfloat16, hq, hkv, d, lens, ctxs, seed=2)
    scale = d ** -0.5
    out = torch.full((q.shape[0] + 2, hq * d), 7.0, dtype=torch.bfloat16)
    _run(q, cache, bt, starts, lens, ctxs, hq, scale, kernel, out)
    ref = _reference(q, cache, table, starts, lens, ctxs, hq, scale)
    got = out[:q.shape[0]].double()
    vmax = cache[1].abs().max().item()
    torch.testing.assert_close(got, ref, atol=2 ** -9 * vmax, rtol=2 ** -8)
    assert (got - ref).abs().mean() < 2 ** -9 * ref.abs().mean() + 1e-4
    assert (out[q.shape[0]:] == 7.0).all()


def test_the_bf16_kernels_are_built_where_the_cpu_has_them():
    """-march=native must compile the bf16 dot path in on a CPU with AVX512-BF16 and
    the AMX path on one with AMX (the guards read the compiler's target macros; Linux
    5.16+ lends the tile state on request), and the argument must reach them: the
    kernels round differently, so their outputs differ somewhere."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split() for line in f if line.startswith("flags")), [])
    best = prefill_ops.best_bf16_kernel()
    if "avx512_bf16" not in flags:
        assert best == prefill_ops.FMA
        pytest.skip("this CPU has no AVX512-BF16: only the float32 path exists")
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    if {"amx_bf16", "amx_tile"} <= set(flags) and release >= (5, 16):
        assert best == prefill_ops.AMX
    else:
        assert best == prefill_ops.DOT
    lens, ctxs = [64, 40], [0, 21]
    q, cache, _, bt, starts = _case(torch.bfloat16, 9, 3, 64, lens, ctxs, seed=3)
    outs = [_run(q, cache, bt, starts, lens, ctxs, 9, 0.125, k)
            for k in range(best + 1)]
    assert not torch.equal(outs[0], outs[1])  # float32 P vs bf16 P
    for other in outs[1:]:
        torch.testing.assert_close(other.double(), outs[0].double(), atol=1.5e-2, rtol=1e-2)


@pytest.mark.parametrize("kernel", BF16_KERNELS)
def test_float32_ignores_the_bf16_kernel(kernel):
    lens, ctxs = [20, 3], [0, 9]
    q, cache, table, bt, starts = _case(torch.float32, 6, 2, 64, lens, ctxs, seed=4)
    out = _run(q, cache, bt, starts, lens, ctxs, 6, 0.125, kernel)
    ref = _reference(q, cache, table, starts, lens, ctxs, 6, 0.125)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kernel", BF16_KERNELS)
def test_long_prompt_and_large_context(kernel):
    """Many query tiles and key tiles, scores spread wide (the running max moves)."""
    lens, ctxs = [300, 129], [0, 260]
    q, cache, table, bt, starts = _case(torch.bfloat16, 6, 2, 64, lens, ctxs, seed=1)
    q = q * 4  # sharper softmax: the online rescaling matters
    out = _run(q, cache, bt, starts, lens, ctxs, 6, 0.125, kernel)
    ref = _reference(q, cache, table, starts, lens, ctxs, 6, 0.125)
    torch.testing.assert_close(out.double(), ref, atol=8e-3, rtol=8e-3)


def test_bad_arguments_are_refused():
    q, cache, _, bt, _ = _case(torch.float32, 2, 2, 64, [4], [0])
    ints = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="query_len"):
        prefill_ops.prefill_attention(q, cache, bt, ints, torch.tensor([4]), ints, 2, BLOCK,
                                      1.0, torch.empty(4, 128))
    with pytest.raises(ValueError, match="dtype"):
        prefill_ops.prefill_attention(q, cache, bt, ints, ints + 4, ints, 2, BLOCK, 1.0,
                                      torch.empty(4, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_with_the_prefill_kernel_matches_transformers(tiny_model_factory, monkeypatch,
                                                             dtype):
    """Every prefill through the kernel (plan forced): fresh prompts, a prefix-cache hit
    (context from cached blocks) and chunked prefill (context from earlier chunks) give
    transformers' greedy tokens (bf16: but at its near ties) and prompt logprobs. head_dim 64 (hidden 256, 4 heads,
    2 KV heads): GQA and the full-vector path."""
    import transformers

    from vllm import LLM, SamplingParams
    from vllm.cpu import prefill_choice
    from vllm.cpu.prefill_choice import FLASH, PrefillPlan

    path = tiny_model_factory("llama", hidden_size=256, intermediate_size=256)
    monkeypatch.setattr(prefill_choice, "choose_plan", lambda *a: PrefillPlan((FLASH,) * 4))
    calls = []
    real = prefill_ops.prefill_attention
    monkeypatch.setattr(prefill_ops, "prefill_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 10000, (48,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 10000, (n,), generator=g).tolist()
               for n in (5, 37, 90)] + [torch.randint(0, 10000, (21,), generator=g).tolist()]
    llm = LLM(model=path, dtype=dtype, max_model_len=512, max_num_batched_tokens=64,
              enable_prefix_caching=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=0)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    assert calls, "the prefill kernel was never called"
    hf_dtype = getattr(torch, dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=hf_dtype)
    for prompt, out in zip(prompts, first + rest):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        _assert_greedy_matches(model, prompt, list(out.outputs[0].token_ids),
                               tie=0.0 if dtype == "float32" else 2 ** -5)
        ref_lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
        got = torch.tensor([next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]])
        tol = 1e-3 if dtype == "float32" else 0.1
        torch.testing.assert_close(got, ref_lp, atol=tol, rtol=0)


def _assert_greedy_matches(model, prompt: list[int], got: list[int], tie: float) -> None:
    """got is transformers' greedy continuation of prompt, except that at a step where
    transformers' own top two logits are within `tie` (one bf16 step at logits of 4-8:
    summing in another order may take either) got may take the other one; from there
    it must go on as transformers does from got's token."""
    done = 0
    while done < len(got):
        ids = torch.tensor([prompt + got[:done]])
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=len(got) - done,
                                 do_sample=False)[0, ids.shape[1]:].tolist()
        if got[done:] == ref:
            return
        k = done + next(i for i, (a, b) in enumerate(zip(got[done:], ref)) if a != b)
        with torch.no_grad():
            last = model(torch.tensor([prompt + got[:k]])).logits[0, -1].float()
        assert last[got[k]] >= last.max() - tie, (
            f"token {k}: {got[k]} is not transformers' greedy token {ref[k - done]} "
            f"(logits {last[got[k]]:.4f} / {last.max():.4f}), nor within {tie} of it")
        done = k + 1


def test_the_plan_takes_the_fastest_kernel_per_length_and_no_rowwise_past_1024(
        monkeypatch, tmp_path):
    from vllm.cpu import prefill_choice
    from vllm.cpu.prefill_choice import FLASH, ROWWISE, SDPA, plan_from

    timings = [{ROWWISE: [1.0], FLASH: [2.0], SDPA: [3.0]},
               {ROWWISE: [2.0], FLASH: [1.0], SDPA: [3.0]},
               {ROWWISE: [1.0], FLASH: [3.0], SDPA: [2.0]}]
    plan = plan_from(timings)
    assert plan.kinds == (ROWWISE, FLASH, ROWWISE, SDPA)
    assert [plan.kind_for(n) for n in (2, 64, 65, 256, 257, 1024, 1025, 8000)] == \
        [ROWWISE, ROWWISE, FLASH, FLASH, ROWWISE, ROWWISE, SDPA, SDPA]
    # measured once on this machine, then read back from the cache
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(prefill_choice.autotune, "stable", lambda samples: True)
    monkeypatch.setattr(prefill_choice, "_MEASURED", {})
    first = prefill_choice.choose_plan(4, 2, 16, torch.float32)
    assert first is not None and len(first.kinds) == 4 and first.kinds[-1] != ROWWISE
    monkeypatch.setattr(prefill_choice, "measure", lambda *a: pytest.fail("measured again"))
    assert prefill_choice.choose_plan(4, 2, 16, torch.float32) == first  # this process
    prefill_choice._MEASURED.clear()
    assert prefill_choice.choose_plan(4, 2, 16, torch.float32) == first  # the disk cache
