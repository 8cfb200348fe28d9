"""VLLM_BATCH_INVARIANT=1 on the fake HPU: in bf16 a request's tokens do not depend on
its neighbours (or on the bucket its pass is padded to).

Without the mode the GEMM library's kernel, chosen by the row count of the call,
changes a row's result with the bucket (the lm_head of the default model does, at
128 rows on an AMX CPU); with it every GEMM without a native per-row kernel runs in
fixed row tiles (vllm/model_executor/layers/batch_invariant.py).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.hpu.conftest import platform_env, release
from vllm import LLM, SamplingParams
from vllm.model_executor.layers.batch_invariant import ROW_TILE, row_invariant_linear

PROMPTS = [f"Request {i}. Tell me about the number {i}. " for i in range(4)]
NEIGHBOURS = ["Write a long story about a lighthouse keeper who finds a map. " * 4, "1 2 3"]


def test_row_tiles_make_a_row_independent_of_the_call():
    torch.manual_seed(0)
    w = torch.randn(4096, 256, dtype=torch.bfloat16)
    b = torch.randn(4096, dtype=torch.bfloat16)
    x = torch.randn(3 * ROW_TILE + 5, 256, dtype=torch.bfloat16)
    alone = row_invariant_linear(x[7:8], w, b)
    for rows in (1, 9, ROW_TILE, ROW_TILE + 1, x.shape[0]):
        out = row_invariant_linear(x[7 - min(7, rows - 1):][:rows], w, b)
        assert torch.equal(out[min(7, rows - 1)], alone[0])
    full = row_invariant_linear(x.view(1, -1, 256), w, b)
    assert full.shape == (1, x.shape[0], 4096)
    torch.testing.assert_close(full[0].float(), F.linear(x, w, b).float(), rtol=2e-2, atol=2e-1)


def _params(i: int) -> SamplingParams:
    """Greedy for even i, seeded temperature-1 sampling with n=2 for odd i."""
    if i % 2 == 0:
        return SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=12, ignore_eos=True, n=2)


@pytest.mark.timeout(600)
def test_fake_hpu_bf16_alone_equals_in_a_batch():
    with platform_env("hpu", VLLM_BATCH_INVARIANT="1", VLLM_SKIP_WARMUP="1",
                      PT_HPU_LAZY_MODE="1"):
        llm = LLM(dtype="bfloat16", max_model_len=512, seed=0, max_num_seqs=8,
                  enable_prefix_caching=False)
        torch.set_num_threads(1)
        try:
            alone = [[tuple(c.token_ids) for c in llm.generate(
                [p], _params(i), use_tqdm=False)[0].outputs] for i, p in enumerate(PROMPTS)]
            outs = llm.generate([NEIGHBOURS[0], *PROMPTS, NEIGHBOURS[1]],
                                [_params(8), *(_params(i) for i in range(4)), _params(9)],
                                use_tqdm=False)
            batch = [[tuple(c.token_ids) for c in o.outputs] for o in outs[1:5]]
            assert batch == alone
        finally:
            release(llm)
