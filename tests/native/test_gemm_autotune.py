"""Kernel choice by measurement: plans per weight shape and row bucket, cached per machine,
forced by VLLM_CPU_NATIVE_GEMM, and every call dispatched to its row count's kernel."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vllm.cpu import autotune, gemm as cpu_gemm, gemm_autotune
from vllm.cpu.gemm_autotune import (AMX, FP32, NATIVE, ONEDNN, ROW_BUCKETS,
                                                      TORCH, GemmPlan)
from vllm.cpu import cpu_ops


def _layer(n: int = 40, k: int = 64) -> nn.Linear:
    layer = nn.Linear(k, n, bias=True).bfloat16().requires_grad_(False)
    layer.packable_weight = True
    return layer


ROWS = (1, 5, 20, 100, 300)


def _calls_at_each_row_count(monkeypatch, layer: nn.Linear, kernel: str) -> int:
    """Runs `layer` at each of ROWS rows (checked against a float linear); returns how
    many of those calls reached cpu_ops.<kernel>."""
    seen = []
    real = getattr(cpu_ops, kernel)
    monkeypatch.setattr(cpu_ops, kernel, lambda *a: seen.append(1) or real(*a))
    for rows in ROWS:
        x = torch.randn(rows, layer.weight.shape[1]).bfloat16()
        ref = F.linear(x.float(), layer.weight.float(), layer.bias.float())
        got = cpu_gemm.linear(layer, x, layer.weight, layer.bias)
        torch.testing.assert_close(got.float(), ref, atol=5e-2, rtol=2e-2)
    return len(seen)


def test_row_buckets_map_to_the_nearest_measured_count():
    plan = GemmPlan(("a", "b", "c", "d", "e", "f"))
    assert [plan.kind_for(r) for r in (1, 2, 3, 8, 9, 32, 33, 128, 129, 512, 513, 8192)] == \
        ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e", "f", "f"]


def test_measure_times_every_candidate():
    w = torch.randn(48, 64).bfloat16()
    kinds = gemm_autotune.available_kinds()
    t = gemm_autotune.measure(w, kinds, rows=4)
    assert set(t) == set(kinds)
    assert all(v == sorted(v) and 0 < v[0] < 1 for v in t.values())


def test_unsteady_timings_are_not_cached():
    assert autotune.stable({"a": [1.0, 1.1, 5.0], "b": [2.0, 2.5]})
    assert not autotune.stable({"a": [1.0, 1.1], "b": [2.0, 3.0]})


def test_plans_are_measured_once_then_read_from_the_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(gemm_autotune.autotune, "stable", lambda samples: True)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.delenv("VLLM_CPU_NATIVE_GEMM", raising=False)
    shapes = {(40, 64): torch.randn(40, 64).bfloat16(), (24, 32): torch.randn(24, 32).bfloat16()}
    first = gemm_autotune.plan_shapes(shapes)
    assert set(first) == set(shapes)
    kinds = gemm_autotune.available_kinds()
    assert all(k in kinds for p in first.values() for k in p.kinds)
    files = list((tmp_path / "gemm").glob("plans-*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert stored == {"40,64": list(first[(40, 64)].kinds), "24,32": list(first[(24, 32)].kinds)}

    def no_measuring(*args):
        raise AssertionError("a cached shape was measured again")

    monkeypatch.setattr(gemm_autotune, "choose", no_measuring)
    assert gemm_autotune.plan_shapes(shapes) == first


def test_a_corrupt_cache_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setattr(gemm_autotune.autotune, "stable", lambda samples: True)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.delenv("VLLM_CPU_NATIVE_GEMM", raising=False)
    path = gemm_autotune.cache_path(gemm_autotune.available_kinds())
    path.parent.mkdir(parents=True)
    path.write_text('{"40,64": ["no-such-kernel"]}')
    plans = gemm_autotune.plan_shapes({(40, 64): torch.randn(40, 64).bfloat16()})
    assert len(plans[(40, 64)].kinds) == len(ROW_BUCKETS)
    assert "no-such-kernel" not in json.loads(path.read_text())["40,64"]


@pytest.mark.parametrize("value,kind", [("0", ONEDNN), ("1", NATIVE)])
def test_the_variable_forces_a_kernel_without_measuring(monkeypatch, tmp_path, value, kind):
    if kind == NATIVE and not cpu_ops.gemm_supported():
        pytest.skip("no native GEMM (AVX512-BF16 or AVX2) on this CPU")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("VLLM_CPU_NATIVE_GEMM", value)
    monkeypatch.setattr(gemm_autotune, "choose", lambda *a: pytest.fail("measured"))
    plans = gemm_autotune.plan_shapes({(40, 64): torch.randn(40, 64).bfloat16()})
    if kind not in gemm_autotune.available_kinds():  # oneDNN without bf16 (AVX2 CPUs)
        kind = gemm_autotune.fallback_kind()
    assert plans[(40, 64)].kinds == (kind,) * len(ROW_BUCKETS)
    assert not (tmp_path / "gemm").exists()


def test_each_call_runs_its_row_counts_kernel(monkeypatch):
    kinds = gemm_autotune.available_kinds()
    mixed = tuple(kinds[i % len(kinds)] for i in range(len(ROW_BUCKETS)))
    plan = GemmPlan(mixed)
    layer = _layer()
    cpu_gemm.pack_module(layer, plan)
    assert set(layer.gemm_packs) == set(mixed) - {TORCH}
    seen = _calls_at_each_row_count(monkeypatch, layer, "gemm_bf16_packed")
    assert seen == sum(plan.kind_for(r) == NATIVE for r in ROWS)


def test_three_dimensional_inputs_keep_their_shape():
    layer = _layer()
    cpu_gemm.pack_module(layer, GemmPlan((gemm_autotune.available_kinds()[-1],) * len(ROW_BUCKETS)))
    x = torch.randn(2, 3, 64).bfloat16()
    got = cpu_gemm.linear(layer, x, layer.weight, layer.bias)
    assert got.shape == (2, 3, 40)
    torch.testing.assert_close(got.float(), F.linear(x.float(), layer.weight.float(),
                                                     layer.bias.float()), atol=5e-2, rtol=2e-2)


def test_an_odd_k_cannot_take_the_native_pack():
    if not cpu_ops.gemm_supported():
        pytest.skip("no native GEMM (AVX512-BF16 or AVX2) on this CPU")
    layer = _layer(n=16, k=33)
    plan = cpu_gemm.pack_module(layer, GemmPlan((NATIVE,) * len(ROW_BUCKETS)))
    fallback = gemm_autotune.fallback_kind()
    assert plan.kinds == (fallback,) * len(ROW_BUCKETS) and set(layer.gemm_packs) == {fallback}
    x = torch.randn(3, 33).bfloat16()
    torch.testing.assert_close(cpu_gemm.linear(layer, x, layer.weight, layer.bias).float(),
                               F.linear(x.float(), layer.weight.float(), layer.bias.float()),
                               atol=5e-2, rtol=2e-2)


def test_kinds_far_behind_are_not_timed_at_larger_row_counts(monkeypatch):
    """A kind 4x slower than the best at some row count is dropped from the larger ones."""
    timed = []

    def fake_measure(weight, kinds, rows):
        timed.append((rows, tuple(kinds)))
        slow = {"fast": 1.0, "close": 1.5, "slow": 2.0 if rows < 16 else 10.0}
        return {k: [slow[k], slow[k]] for k in kinds}

    monkeypatch.setattr(gemm_autotune, "measure", fake_measure)
    plan, timings, _ = gemm_autotune.choose(torch.empty(4, 4), ["fast", "close", "slow"])
    assert plan.kinds == ("fast",) * len(ROW_BUCKETS)
    assert [kinds for _, kinds in timed] == [("fast", "close", "slow")] * 3 + \
        [("fast", "close")] * (len(ROW_BUCKETS) - 3)
    assert "slow" in timings[2] and "slow" not in timings[3]


def test_native_kinds_win_close_calls_at_decode_sizes(monkeypatch):
    """Within the margin the native kinds win (they keep the fused decode layer), except
    in the last bucket (prompt chunks), where the fastest does."""
    assert gemm_autotune._winner({ONEDNN: 1.0, AMX: 1.4, NATIVE: 3.0}) == AMX
    assert gemm_autotune._winner({ONEDNN: 1.0, AMX: 1.6, NATIVE: 1.45}) == NATIVE
    assert gemm_autotune._winner({ONEDNN: 1.0, AMX: 1.6}) == ONEDNN
    assert gemm_autotune._winner({TORCH: 2.0, FP32: 1.0}) == FP32
    monkeypatch.setattr(gemm_autotune, "measure", lambda w, kinds, rows: {
        ONEDNN: [1.0, 1.0], AMX: [1.2, 1.2]})
    plan, _, _ = gemm_autotune.choose(torch.empty(4, 4), [ONEDNN, AMX])
    assert plan.kinds == (AMX,) * (len(ROW_BUCKETS) - 1) + (ONEDNN,)


def test_amx_shares_the_native_pack_and_needs_whole_k_steps():
    """AMX reads the native kernel's pack (one tensor for both kinds); a weight whose K
    is no multiple of 32 takes the native kernel where the plan says AMX."""
    if not cpu_ops.gemm_supported():
        pytest.skip("no native GEMM (AVX512-BF16 or AVX2) on this CPU")
    layer = _layer(n=40, k=64)
    plan = cpu_gemm.pack_module(layer, GemmPlan((NATIVE, AMX, AMX, ONEDNN, ONEDNN, ONEDNN)))
    assert plan.kinds == (NATIVE, AMX, AMX, ONEDNN, ONEDNN, ONEDNN)
    assert layer.gemm_packs[AMX] is layer.gemm_packs[NATIVE]
    assert cpu_gemm.native_pack(layer) is layer.gemm_packs[NATIVE]
    assert plan.mask_of(AMX) == 0b00110
    odd = _layer(n=16, k=48)
    plan = cpu_gemm.pack_module(odd, GemmPlan((AMX,) * len(ROW_BUCKETS)))
    assert plan.kinds == (NATIVE,) * len(ROW_BUCKETS) and set(odd.gemm_packs) == {NATIVE}
    amx_only = _layer(n=16, k=32)
    cpu_gemm.pack_module(amx_only, GemmPlan((AMX,) * len(ROW_BUCKETS)))
    assert cpu_gemm.native_pack(amx_only) is amx_only.gemm_packs[AMX]
    assert gemm_autotune.kinds_for_shape([TORCH, NATIVE, AMX], (16, 48)) == [TORCH, NATIVE]
    assert gemm_autotune.kinds_for_shape([TORCH, NATIVE, AMX], (16, 64)) == [TORCH, NATIVE, AMX]


@pytest.mark.skipif(not cpu_ops.amx_gemm_supported(), reason="no AMX tiles on this CPU")
def test_amx_rows_run_the_amx_kernel(monkeypatch):
    layer = _layer(n=40, k=64)
    plan = cpu_gemm.pack_module(layer, GemmPlan((NATIVE, AMX, AMX, AMX, NATIVE, NATIVE)))
    seen = _calls_at_each_row_count(monkeypatch, layer, "gemm_bf16_amx")
    assert seen == sum(plan.kind_for(r) == AMX for r in ROWS) == 3


def test_unsteady_choices_are_cached_and_timed_again_only_a_few_starts(monkeypatch,
                                                                       tmp_path):
    """A busy machine must not make every start time everything again: an unsteady
    choice is cached with its quality, timed again at the next starts until MAX_TRIES
    starts have tried (keeping the steadiest), then used as it is; VLLM_CPU_RETUNE=1
    times it again on request."""
    monkeypatch.setattr(gemm_autotune.autotune, "stable", lambda samples: False)
    monkeypatch.setattr(gemm_autotune.autotune, "machine_busy", lambda: False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.delenv("VLLM_CPU_NATIVE_GEMM", raising=False)
    monkeypatch.delenv("VLLM_CPU_RETUNE", raising=False)
    shapes = {(40, 64): torch.randn(40, 64).bfloat16()}
    path = gemm_autotune.cache_path(gemm_autotune.available_kinds())
    timed = []
    real_choose = gemm_autotune.choose
    monkeypatch.setattr(gemm_autotune, "choose", lambda *a: timed.append(1) or real_choose(*a))
    for start in range(1, autotune.MAX_TRIES + 2):
        plans = gemm_autotune.plan_shapes(shapes)
        assert len(plans[(40, 64)].kinds) == len(ROW_BUCKETS)
        entry = json.loads(path.read_text())["40,64"]
        assert entry["steady"] is False and entry["kinds"] == list(plans[(40, 64)].kinds)
        assert entry["tries"] == min(start, autotune.MAX_TRIES)
    assert len(timed) == autotune.MAX_TRIES  # the last start used the cache
    monkeypatch.setenv("VLLM_CPU_RETUNE", "1")
    gemm_autotune.plan_shapes(shapes)
    assert len(timed) == autotune.MAX_TRIES + 1


def test_keep_best_prefers_steady_then_the_least_noisy():
    samples = lambda ratio: [{"a": [1.0, ratio]}]  # noqa: E731
    steady = autotune.keep_best(None, ("a",), samples(1.1))
    assert steady.steady and steady.to_json() == ["a"]
    noisy = autotune.keep_best(None, ("b",), samples(2.0))
    assert not noisy.steady and noisy.noise == 2.0 and noisy.tries == 1
    # A steadier unsteady timing replaces it; a noisier one does not; tries count up.
    better = autotune.keep_best(noisy, ("c",), samples(1.5))
    assert (better.kinds, better.tries) == (("c",), 2)
    worse = autotune.keep_best(better, ("d",), samples(3.0))
    assert (worse.kinds, worse.tries) == (("c",), 3)
    # A cached steady choice is kept over an unsteady re-timing (VLLM_CPU_RETUNE on a
    # busy machine); a steady re-timing replaces anything.
    assert autotune.keep_best(steady, ("e",), samples(2.0)) == steady
    assert autotune.keep_best(worse, ("f",), samples(1.0)).kinds == ("f",)
    assert autotune.CachedChoice.from_json(["a", "b"]) == autotune.CachedChoice(("a", "b"), True)


def test_onednn_is_no_candidate_where_its_bf16_kernel_raises(monkeypatch, tmp_path):
    """AVX2-only CPUs: torch's bf16 reorder raises; start-up must measure the rest."""
    real_pack = gemm_autotune.pack

    def pack(kind, weight):
        if kind == ONEDNN:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu "
                               "support avx_ne_convert or avx512bw, avx512vl and avx512dq")
        return real_pack(kind, weight)

    monkeypatch.setattr(gemm_autotune, "pack", pack)
    monkeypatch.setattr(gemm_autotune, "_PROBED", {})
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.delenv("VLLM_CPU_NATIVE_GEMM", raising=False)
    kinds = gemm_autotune.available_kinds()
    assert ONEDNN not in kinds and {TORCH, FP32} <= set(kinds)
    assert gemm_autotune.fallback_kind() == FP32
    plans = gemm_autotune.plan_shapes({(40, 64): torch.randn(40, 64).bfloat16()})
    assert ONEDNN not in plans[(40, 64)].kinds
    monkeypatch.setenv("VLLM_CPU_NATIVE_GEMM", "0")
    assert gemm_autotune.plan_shapes({(40, 64): torch.randn(40, 64).bfloat16()})[
        (40, 64)].kinds == (FP32,) * len(ROW_BUCKETS)


def test_the_float32_kernel_matches_a_float_linear():
    layer = _layer(n=48, k=96)
    plan = cpu_gemm.pack_module(layer, GemmPlan((FP32,) * len(ROW_BUCKETS)))
    assert plan.kinds == (FP32,) * len(ROW_BUCKETS) and set(layer.gemm_packs) == {FP32}
    assert layer.gemm_packs[FP32].dtype == torch.float32
    for rows in (1, 17, 300):
        x = torch.randn(rows, 96).bfloat16()
        ref = F.linear(x.double(), layer.weight.double(), layer.bias.double())
        got = cpu_gemm.linear(layer, x, layer.weight, layer.bias)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, 48)
        # float32 accumulation, one rounding to bf16 at the end
        torch.testing.assert_close(got.double(), ref, atol=1e-2, rtol=8e-3)


@pytest.mark.parametrize("flags,native_ops,expect", [
    ({"avx512_bf16", "avx512f"}, "1", torch.bfloat16),
    ({"amx_bf16"}, "0", torch.bfloat16),
    ({"avx2", "fma"}, "1", torch.bfloat16),    # the AVX2 packed GEMM reads bf16 weights
    ({"avx2", "fma"}, "0", torch.float32),     # no native kernels: torch's bf16 is scalar
    ({"sse4_2"}, "1", torch.float32),
])
def test_auto_dtype_of_a_float32_checkpoint_follows_the_fast_kernel(monkeypatch, flags,
                                                                    native_ops, expect):
    from vllm.cpu import platform as cpu
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: set(flags))
    monkeypatch.setenv("VLLM_CPU_NATIVE_OPS", native_ops)
    platform = cpu.CpuPlatform()
    assert platform.resolve_auto_dtype(torch.float32) == expect
    assert platform.supported_dtypes[0] == expect


def test_plans_are_timed_with_the_serving_thread_count(monkeypatch, tmp_path):
    """The CPU runner packs weights on one thread but serves with all of them: the
    timing (and the cache key) use the serving count given by `serving_threads`."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    seen = []
    monkeypatch.setattr(gemm_autotune, "choose",
                        lambda w, kinds: seen.append(torch.get_num_threads()) or
                        (GemmPlan((FP32,) * len(ROW_BUCKETS)), [{}] * len(ROW_BUCKETS),
                         [{"fp32": [1.0, 1.0]}]))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with autotune.serving_threads(3):
            assert autotune.timing_threads() == 3
            gemm_autotune.plan_shapes({(40, 64): torch.randn(40, 64).bfloat16()})
            path = gemm_autotune.cache_path(gemm_autotune.available_kinds())
        assert torch.get_num_threads() == 1  # the caller's count is left as it was
    finally:
        torch.set_num_threads(before)
    assert seen == [3]
    assert path != gemm_autotune.cache_path(gemm_autotune.available_kinds()) or before == 3


def test_a_busy_machine_keeps_the_cached_unsteady_choice(monkeypatch):
    """A later start on a busy machine (load above its CPUs) does not time an unsteady
    choice again; a quiet one does (until MAX_TRIES); the first start always times."""
    import os
    choice = autotune.CachedChoice(("a",), steady=False, noise=2.0, tries=1)
    monkeypatch.delenv("VLLM_CPU_RETUNE", raising=False)
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus + 0.5, 0.0, 0.0))
    assert autotune.machine_busy() and not choice.needs_timing()
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus * 0.5, 0.0, 0.0))
    assert not autotune.machine_busy() and choice.needs_timing()
    monkeypatch.setenv("VLLM_CPU_RETUNE", "1")
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus + 4.0, 0.0, 0.0))
    assert choice.needs_timing()  # asked for: always

