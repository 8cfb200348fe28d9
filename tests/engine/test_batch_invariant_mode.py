"""VLLM_BATCH_INVARIANT=1: in bf16, a request's tokens do not depend on its neighbours.

By default the CPU's GEMM kernel is chosen per row count (the native kernel for a few
rows, oneDNN's AMX or a float32 copy for many), so a prompt prefilled alone and the
same prompt prefilled beside others go through different kernels, and in bf16 greedy
and seeded outputs drift apart after a few tokens (vLLM has the same property and the
same switch). With the mode on, one kernel that computes each row alone serves every
row count.
"""
from __future__ import annotations

import pytest

from vllm import LLM, SamplingParams
from vllm.cpu import cpu_ops

needs_native_gemm = pytest.mark.skipif(not cpu_ops.gemm_supported(),
                                       reason="no native bf16 GEMM on this CPU")

PROMPTS = [f"Request {i}. Tell me about the number {i}. " for i in range(4)]
NEIGHBOURS = ["Write a long story about a lighthouse keeper who finds a map. " * 4,
              "1 2 3", "Explain photosynthesis to a child in three sentences, please.",
              "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 3]


def _params(i: int, kind: str) -> SamplingParams:
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=24, ignore_eos=True,
                          n=2 if kind == "seeded_n2" else 1)


def _tokens(outputs) -> list[list[tuple[int, ...]]]:
    return [[tuple(c.token_ids) for c in o.outputs] for o in outputs]


@pytest.fixture(scope="module")
def invariant_llm():
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_BATCH_INVARIANT", "1")
    mp.delenv("VLLM_CPU_NATIVE_GEMM", raising=False)
    try:
        llm = LLM(dtype="bfloat16", max_model_len=512, seed=0,
                  kv_cache_memory_bytes=64 << 20)
        yield llm
    finally:
        mp.undo()


@needs_native_gemm
@pytest.mark.parametrize("kind", ["greedy", "seeded", "seeded_n2"])
def test_alone_equals_in_a_batch_with_different_neighbours(invariant_llm, kind):
    llm = invariant_llm
    alone = [_tokens(llm.generate([p], _params(i, kind), use_tqdm=False))[0]
             for i, p in enumerate(PROMPTS)]
    for neighbours in (NEIGHBOURS[:2], NEIGHBOURS[2:]):
        prompts = [neighbours[0], *PROMPTS, neighbours[1]]
        params = [_params(9, "greedy"), *(_params(i, kind) for i in range(4)),
                  _params(8, "seeded")]
        batch = _tokens(llm.generate(prompts, params, use_tqdm=False))[1:5]
        assert batch == alone, kind


@needs_native_gemm
def test_the_mode_uses_one_gemm_kernel_for_every_row_count(invariant_llm):
    from vllm.cpu.gemm import plan_of
    model = invariant_llm.llm_engine.engine_core.executor.worker.model_runner.model
    plans = {plan_of(m) for m in model.modules() if plan_of(m) is not None}
    assert plans and all(set(p.kinds) == {"native"} for p in plans), plans


def test_native_gemm_off_contradicts_the_mode(monkeypatch):
    from vllm.cpu import gemm_autotune
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    monkeypatch.setenv("VLLM_CPU_NATIVE_GEMM", "0")
    with pytest.raises(ValueError, match="VLLM_BATCH_INVARIANT=1 needs the native GEMM"):
        gemm_autotune.forced_kind()
