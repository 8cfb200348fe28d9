"""The pure parts of benchmarks/bucket_grid_tradeoff.py (no engine start, no timing):
the grids compared, the workload with cached prefixes, and the replayed waste."""
from __future__ import annotations

from benchmarks.bucket_grid_tradeoff import BLOCK_SIZE, BUDGET, gaudi_grid, rows_for, workload
from vllm.hpu.bucket_trace import EngineLimits

LIMITS = EngineLimits(BLOCK_SIZE, 8, BUDGET, 512, use_prompt_context=True, num_kv_blocks=32)


def test_workload_has_cached_prefixes_and_fits_the_limits():
    passes = workload(LIMITS, 100)
    prompts = [p for p in passes if p.phase == "prompt"]
    ctx = [c for p in prompts for c in p.ctx_blocks]
    assert any(ctx) and not all(ctx)  # every other request behind the cached prefix
    assert all(q + c * BLOCK_SIZE < 512 for p in prompts
               for q, c in zip(p.query_lens, p.ctx_blocks))
    assert sum(len(p.query_lens) for p in prompts) == 100


def test_gaudi_grid_follows_its_filters():
    prompt, decode = gaudi_grid(LIMITS)
    assert {b.num_blocks for b in prompt} == {0, 1, 2, 3}  # (0, 1, 3) context range
    for b in prompt:
        assert b.batch_size * (b.query_len + b.num_blocks * 128) <= BUDGET
        assert b.query_len + b.num_blocks * 128 <= 512
    assert sorted({b.num_blocks for b in decode}) == [1, 8, 16, 24, 32]
    assert all(b.batch_size <= b.num_blocks <= 4 * b.batch_size for b in decode)


def test_rows_compare_the_three_grids():
    ours, gaudi, plan = rows_for(LIMITS, workload(LIMITS, 100), 16)
    assert (len(ours.prompt), len(ours.decode)) == (65, 21)  # issue 54's default grid
    assert len(gaudi.prompt) < len(ours.prompt) and len(plan.prompt) <= 16
    assert any(b.num_blocks for b in plan.prompt)  # the plan has context buckets
    for row in (ours, gaudi, plan):
        assert 0 <= row.waste["prompt"] < 1 and 0 <= row.waste["decode"] < 1
