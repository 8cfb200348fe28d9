"""fp8 KV cache on the fake HPU: greedy tokens and top-5 logprobs equal to the CPU
platform's with the same `--kv-cache-dtype` (which tests/quantization/test_fp8_kv.py
checks against transformers with K/V quantize-dequantized).

Unit scales (a checkpoint without KV scales): Gaudi's cast multiplies by the inverse
scale where the CPU divides by the scale, identical for 1.0, so both platforms store
the same fp8 bytes up to summation order: a K/V element computed a rounding apart that
sits on an fp8 rounding boundary lands on the other neighbour (seen: one logprob moved
by 1.05e-3 at step 12). Tokens must be identical, logprobs within 1e-2."""
from __future__ import annotations

import pytest
import torch

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from vllm import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
FAST = {"VLLM_SKIP_WARMUP": "1", "PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
        "VLLM_PROMPT_SEQ_BUCKET_MAX": "64"}
LENGTHS = [3, 9, 17, 30, 5, 12, 21, 26]

# chunked: later chunks are prompt passes that read the cached (fp8) context.
CASES = {"fp8_inc": ("fp8_inc", {}), "fp8_e5m2-chunked": ("fp8_e5m2", dict(
    max_num_batched_tokens=16, enable_prefix_caching=False))}


def _generate(path: str, cache_dtype: str, prompts=None, **kwargs):
    llm = make_llm(model=path, block_size=16, kv_cache_memory_bytes=32 << 20,
                   max_model_len=256, kv_cache_dtype=cache_dtype, **kwargs)
    if prompts is None:
        prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    dtype = next(c for c in runner_of(llm).kv_caches if c is not None)[0].dtype
    release(llm)
    return prompts, [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs], dtype


@pytest.mark.parametrize("case", list(CASES))
def test_fake_hpu_fp8_kv_equals_cpu(case, tiny_model_factory):
    from vllm.attention.fp8_kv import KV_CACHE_DTYPES
    cache_dtype, engine_kwargs = CASES[case]
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        prompts, expected, cpu_dtype = _generate(path, cache_dtype, **engine_kwargs)
    with platform_env("hpu", **FAST):
        _, got, hpu_dtype = _generate(path, cache_dtype, prompts, **engine_kwargs)
    assert cpu_dtype == hpu_dtype == KV_CACHE_DTYPES[cache_dtype]
    for (tokens, lps), (ref_tokens, ref_lps) in zip(got, expected):
        assert tokens == ref_tokens
        for step, (ours, ref) in enumerate(zip(lps, ref_lps)):
            for tid, lp in ref.items():
                assert tid in ours, (step, tid)
                assert abs(ours[tid].logprob - lp.logprob) < 1e-2, (step, tid)


def test_flat_pa_reads_fp8_blocks():
    """flat PA on an fp8 cache equals flat PA on the dequantized float cache."""
    from vllm.hpu.paged_attn import build_flat_pa_metadata, flat_paged_attention
    gen = torch.Generator().manual_seed(0)
    bs, blocks, hkv, hq, d = 16, 6, 2, 4, 32
    cache = (torch.randn(2, (blocks + 1) * bs, hkv, d, generator=gen) * 4).to(
        torch.float8_e4m3fn)
    scales = (torch.tensor(0.5), torch.tensor(1.5))
    md = build_flat_pa_metadata([[0, 3], [5, 1, 2]], [20, 40], bs, 2, 6, blocks)
    q = torch.randn(2, hq, d, generator=gen)
    got = flat_paged_attention(q, cache[0], cache[1], md, 0.2, kv_scales=scales)
    want = flat_paged_attention(q, cache[0].float() * 0.5, cache[1].float() * 1.5, md, 0.2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
