"""The native CPU kernels against references written with plain torch / float64.

Each kernel replaces a chain of torch ops on the decode hot path; these tests pin
its numbers to the Hugging Face formula (RMSNorm, rotary, SwiGLU), to a naive float64
attention over random ragged paged contexts, and to a float32 matmul (GEMV). The
loader tests cover the fallbacks: disabled by the environment, or no working compiler.
"""
from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vllm.cpu import cpu_ops, loader

pytestmark = pytest.mark.skipif(not cpu_ops.usable(torch.empty(0)),
                                reason="native CPU kernels unavailable (no C++ compiler?)")

DTYPES = [torch.float32, torch.bfloat16]


def _hf_rms(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward, verbatim in its roundings."""
    hf = h.float()
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return w * hf.to(h.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_hf_and_fuses_the_residual_in_place(dtype):
    torch.manual_seed(0)
    x, res, w = torch.randn(7, 96, dtype=dtype), torch.randn(7, 96, dtype=dtype), \
        torch.rand(96, dtype=dtype) + 0.5
    out = cpu_ops.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(out, _hf_rms(x, w, 1e-5), atol=1e-6, rtol=1e-6)
    xx, rr = x.clone(), res.clone()
    got = cpu_ops.rms_norm(xx, w, 1e-5, residual=rr, out=xx)
    assert got.data_ptr() == xx.data_ptr()
    assert torch.equal(rr, x + res)
    torch.testing.assert_close(xx, _hf_rms(x + res, w, 1e-5), atol=1e-6, rtol=1e-6)


def test_rms_norm_takes_strided_rows():
    torch.manual_seed(1)
    base = torch.randn(5, 200)
    x, w = base[:, 8:72], torch.rand(64) + 0.5
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-6), _hf_rms(x, w, 1e-6))
    with pytest.raises(ValueError, match="x must be 2-D"):
        cpu_ops.rms_norm(base.t(), w, 1e-6)


def _hf_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool):
    """q * cos + rotate_half(q) * sin (neox) or the interleaved-pair form, per head."""
    if neox:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * torch.cat((cos, cos), -1) + rot * torch.cat((sin, sin), -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.flatten(-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox,rot_dim", [(True, 32), (False, 32), (True, 16)])
def test_rotary_rotates_the_leading_heads_in_place(dtype, neox, rot_dim):
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    torch.manual_seed(2)
    head, heads, total = 32, 5, 7  # rotate 5 of 7 heads (q and k; v stays)
    rope = RotaryEmbedding(head, rot_dim, 512, 10000.0, neox, dtype=dtype)
    x = torch.randn(6, total * head, dtype=dtype)
    pos = torch.tensor([0, 3, 77, 200, 511, 5])
    got = x.clone()
    cpu_ops.rotary_(got, pos, rope.cos_sin_cache, heads, head, rot_dim, neox)
    cos, sin = rope.cos_sin_cache[pos].chunk(2, dim=-1)
    h = x.view(6, total, head)[:, :heads]
    ref = _hf_rotate(h[..., :rot_dim], cos[:, None], sin[:, None], neox)
    g = got.view(6, total, head)
    torch.testing.assert_close(g[:, :heads, :rot_dim], ref, atol=1e-6, rtol=1e-6)
    assert torch.equal(g[:, :heads, rot_dim:], h[..., rot_dim:])
    assert torch.equal(g[:, heads:], x.view(6, total, head)[:, heads:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_torch(dtype):
    torch.manual_seed(3)
    x = torch.randn(9, 2 * 100, dtype=dtype) * 4
    ref = F.silu(x[:, :100]) * x[:, 100:]
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(cpu_ops.silu_and_mul(x), ref, atol=tol, rtol=tol)


def test_silu_and_mul_bf16_rounds_like_torch_everywhere():
    """bf16 (the vectorized kernel where the CPU has AVX512-BF16): the same bits as torch's
    silu then product, each rounded to bf16, over a tail that is not a whole vector,
    strided rows, signed zeros, large magnitudes, +inf and NaN. (Below -87 the exponent
    is clamped, so silu(-inf) is -inf here where torch gives NaN: not checked.)"""
    torch.manual_seed(6)
    d = 37
    x = (torch.randn(5, 2 * d + 3) * 6).bfloat16()[:, :2 * d]
    x[0, :5] = torch.tensor([0.0, -0.0, 80.0, -80.0, float("inf")])
    x[1, 3] = float("nan")
    x[2, d + 1] = float("nan")
    ref = F.silu(x[:, :d]) * x[:, d:]
    out = cpu_ops.silu_and_mul(x)
    assert torch.equal(out.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert torch.equal(out[finite], ref[finite])


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_stores_rows_at_their_slots(dtype):
    torch.manual_seed(4)
    hkv, d, slots = 3, 16, 40
    cache = torch.zeros(2, hkv, slots, d, dtype=dtype)
    qkv = torch.randn(5, (6 + 2 * hkv) * d, dtype=dtype)
    k, v = qkv[:, 6 * d:(6 + hkv) * d], qkv[:, (6 + hkv) * d:]
    slot_mapping = torch.tensor([7, 0, 39, 12, 13])
    cpu_ops.write_kv(k, v, cache, slot_mapping)
    ref = torch.zeros_like(cache)
    ref[0].index_copy_(1, slot_mapping, k.reshape(5, hkv, d).transpose(0, 1))
    ref[1].index_copy_(1, slot_mapping, v.reshape(5, hkv, d).transpose(0, 1))
    assert torch.equal(cache, ref)


def _naive_decode(q, cache, table, lens, hq, bs, scale):
    """float64, one sequence and head at a time, straight from the definition."""
    hkv, d = cache.shape[1], cache.shape[3]
    out = torch.zeros(q.shape[0], hq * d, dtype=torch.float64)
    for i, n in enumerate(lens.tolist()):
        slots = [int(table[i, p // bs]) * bs + p % bs for p in range(n)]
        for h in range(hq):
            kh = h // (hq // hkv)
            k = cache[0, kh, slots].double()
            v = cache[1, kh, slots].double()
            qh = q[i, h * d:(h + 1) * d].double()
            p = torch.softmax(k @ qh * scale, dim=0)
            out[i, h * d:(h + 1) * d] = p @ v
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("hq,hkv,d,bs", [(9, 3, 64, 16), (4, 4, 40, 8), (8, 2, 128, 16),
                                         (6, 1, 32, 4)])
def test_decode_attention_matches_float64_on_ragged_paged_contexts(dtype, tol, hq, hkv, d, bs):
    torch.manual_seed(5)
    rng = np.random.default_rng(5)
    num_blocks, n = 96, 6
    cache = torch.randn(2, hkv, num_blocks * bs, d, dtype=dtype)
    lens = torch.tensor([1, 2, bs, bs + 1, 5 * bs - 3, 130][:n], dtype=torch.int32)
    max_blocks = -(-int(lens.max()) // bs)
    table = torch.tensor(np.stack([rng.permutation(num_blocks)[:max_blocks] for _ in range(n)]),
                         dtype=torch.int32)
    q = torch.randn(n, (hq + 2 * hkv) * d, dtype=dtype)[:, :hq * d]  # strided rows
    out = torch.full((n, hq * d), float("nan"), dtype=dtype)
    cpu_ops.decode_attention(q, cache, table, lens, hq, bs, d ** -0.5, out)
    ref = _naive_decode(q, cache, table, lens, hq, bs, d ** -0.5)
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_decode_attention_refuses_int64_tables():
    cache = torch.zeros(2, 1, 16, 8)
    with pytest.raises(ValueError, match="int32"):
        cpu_ops.decode_attention(torch.zeros(1, 8), cache, torch.zeros(1, 1, dtype=torch.long),
                                 torch.ones(1, dtype=torch.int32), 1, 16, 1.0,
                                 torch.zeros(1, 8))


@pytest.mark.skipif(not cpu_ops.gemm_supported(), reason="no native GEMM (AVX512-BF16 or AVX2) on this CPU")
@pytest.mark.parametrize("m", [1, 3, 12, 13, 40])
@pytest.mark.parametrize("n,k", [(96, 576), (33, 40), (7, 100), (50, 2)])
def test_packed_gemm_matches_a_float32_matmul(m, n, k):
    """Row counts around the 12-row tile, feature counts off the 32-feature tile."""
    torch.manual_seed(6)
    x = torch.randn(m, k + 8).bfloat16()[:, 8:]  # strided rows
    w, b = torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16()
    packed = cpu_ops.pack_bf16(w)
    assert packed.numel() == -(-n // 32) * 32 * k
    for bias in (None, b):
        got = cpu_ops.gemm_bf16_packed(x, packed, n, bias)
        ref = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        torch.testing.assert_close(got.float(), ref, atol=1e-2 * ref.abs().max().item(),
                                   rtol=1e-2)


def _avx2_build(tmp_path) -> ctypes.CDLL:
    """cpu_ops built as on a CPU with AVX2 + FMA and no AVX-512 (the AVX2 packed GEMM),
    whatever this CPU has beyond that."""
    flags = loader._cpu_flags().split()
    if not {"avx2", "fma"} <= set(flags):
        pytest.skip("no AVX2 + FMA on this CPU")
    out = tmp_path / "cpu_ops_avx2.so"
    subprocess.run([loader._compiler(), *loader.CXX_FLAGS, "-mno-avx512f", "-o", str(out),
                    str(loader.SOURCE)], check=True, capture_output=True, timeout=120)
    lib = ctypes.CDLL(str(out))
    loader._declare(lib)
    return lib


def test_the_avx2_build_of_the_packed_gemm(tmp_path):
    """The AVX2 + FMA kernel (the one AVX2-only servers run), built here with AVX-512
    switched off: against a float32 matmul, and each row equal to its one-row product
    (batch invariance), over row counts of one and several row groups and enough
    features that each thread runs several tiles (the next-tile prefetch)."""
    lib = _avx2_build(tmp_path)
    assert lib.vllm_has_amx_gemm() == 0
    torch.manual_seed(7)
    for n, k in [(200, 96), (33, 40)]:
        w = torch.randn(n, k).bfloat16()
        packed = torch.empty(lib.vllm_packed_numel(n, k), dtype=torch.bfloat16)
        assert lib.vllm_pack_bf16(w.data_ptr(), n, k, packed.data_ptr(), 2) == 1
        x = torch.randn(17, k + 4).bfloat16()[:, 4:]   # strided rows

        def gemm(rows: torch.Tensor) -> torch.Tensor:
            y = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)
            assert lib.vllm_gemm_bf16_packed(rows.data_ptr(), rows.stride(0), rows.shape[0],
                                             packed.data_ptr(), n, k, 0, y.data_ptr(), n, 2)
            return y
        for m in (1, 2, 3, 17):
            got = gemm(x[:m])
            ref = F.linear(x[:m].float(), w.float())
            torch.testing.assert_close(got.float(), ref, atol=1e-2 * ref.abs().max().item(),
                                       rtol=1e-2)
        whole = gemm(x)
        for i in (0, 5, 16):
            assert torch.equal(whole[i], gemm(x[i:i + 1])[0])


@pytest.mark.skipif(not cpu_ops.amx_gemm_supported(), reason="no AMX tiles on this CPU")
@pytest.mark.parametrize("m", [1, 5, 16, 17, 32, 33, 64, 100])
@pytest.mark.parametrize("n,k", [(96, 576), (33, 64), (576, 1536), (7, 32)])
def test_amx_gemm_matches_a_float64_matmul(m, n, k):
    """Row counts around the 16-row tile and its pairs, features off the 32-feature pair
    of blocks, strided rows; as close to float64 as the dot-product kernel on the same
    pack (both sum float32 products of the same bf16 values)."""
    torch.manual_seed(7)
    x = torch.randn(m, k + 32).bfloat16()[:, 32:]  # strided rows
    w, b = torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16()
    packed = cpu_ops.pack_bf16(w)
    for bias in (None, b):
        got = cpu_ops.gemm_bf16_amx(x, packed, n, bias)
        ref = torch.nn.functional.linear(x.double(), w.double(),
                                         None if bias is None else bias.double())
        dot = cpu_ops.gemm_bf16_packed(x, packed, n, bias)
        # Both round float32 sums to bf16 once: within a bf16 ulp of the exact result.
        tol = 2 ** -7 * ref.abs() + 1e-3 * ref.abs().max()
        assert ((got.double() - ref).abs() <= tol).all()
        assert ((dot.double() - ref).abs() <= tol).all()


@pytest.mark.skipif(not cpu_ops.amx_gemm_supported(), reason="no AMX tiles on this CPU")
def test_amx_gemm_refuses_a_k_that_is_no_multiple_of_32():
    w = torch.randn(16, 48).bfloat16()
    with pytest.raises(ValueError, match="AMX.*K = 48"):
        cpu_ops.gemm_bf16_amx(torch.randn(2, 48).bfloat16(), cpu_ops.pack_bf16(w), 16)


@pytest.mark.parametrize("native", [True, False])
def test_linear_layers_use_their_packed_weight(monkeypatch, native):
    """cpu_gemm.linear through the native pack, or oneDNN's when the native GEMM is off
    (the float32 copy on CPUs where oneDNN has no bf16 kernel)."""
    from torch import nn
    from vllm.cpu import gemm as cpu_gemm, gemm_autotune
    if native and not cpu_ops.gemm_supported():
        pytest.skip("no native GEMM (AVX512-BF16 or AVX2) on this CPU")
    monkeypatch.setattr(cpu_ops, "_GEMM", {"ok": native})
    monkeypatch.setenv("VLLM_CPU_NATIVE_GEMM", "1" if native else "0")
    layer = nn.Linear(64, 40, bias=True).bfloat16().requires_grad_(False)
    layer.packable_weight = True
    assert cpu_gemm.pack_linear_weights(layer) == 1
    kind = "native" if native else gemm_autotune.fallback_kind()
    assert set(layer.gemm_plan.kinds) == {kind}
    assert set(layer.gemm_packs) == {kind}
    for rows in (1, 5, 16):
        x = torch.randn(rows, 64).bfloat16()
        ref = F.linear(x.float(), layer.weight.float(), layer.bias.float())
        torch.testing.assert_close(cpu_gemm.linear(layer, x, layer.weight, layer.bias).float(),
                                   ref, atol=5e-2, rtol=2e-2)
    cpu_gemm.drop_packed_weights(layer)
    assert "gemm_packs" not in layer.__dict__ and "gemm_plan" not in layer.__dict__


def _fresh_loader(monkeypatch, tmp_path, **env):
    monkeypatch.setattr(loader, "_state", {})
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_loader_builds_once_and_caches(monkeypatch, tmp_path):
    _fresh_loader(monkeypatch, tmp_path)
    lib = loader.get_native_lib()
    assert lib is not None and lib.vllm_cpu_ops_version() == 1
    built = list((tmp_path / "native").glob("cpu_ops-*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert loader.build_library() == built[0] and built[0].stat().st_mtime_ns == mtime


def test_a_shared_header_change_rebuilds(monkeypatch, tmp_path):
    """A kernel file includes the folder's headers (vec_math.h): editing one must give a
    new build, not the cached library of the old header."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    header = tmp_path / "answer.h"
    header.write_text("static inline int answer(void) { return 41; }\n")
    source = tmp_path / "header_ops.cpp"
    source.write_text('#include "answer.h"\nextern "C" int vllm_answer(void) { return answer(); }\n')
    import ctypes
    first = loader.build_library(source)
    assert ctypes.CDLL(str(first)).vllm_answer() == 41
    header.write_text("static inline int answer(void) { return 42; }\n")
    second = loader.build_library(source)
    assert second != first and ctypes.CDLL(str(second)).vllm_answer() == 42


def test_loader_disabled_by_environment(monkeypatch, tmp_path):
    _fresh_loader(monkeypatch, tmp_path, VLLM_CPU_NATIVE_OPS="0")
    assert loader.get_native_lib() is None
    assert not cpu_ops.usable(torch.empty(0))


def test_a_broken_compiler_falls_back_to_torch(monkeypatch, tmp_path, caplog):
    _fresh_loader(monkeypatch, tmp_path, CXX="false")
    with caplog.at_level("WARNING", logger="vllm.cpu.loader"):
        assert loader.get_native_lib() is None
    assert "using torch ops instead" in caplog.text
    assert not list((tmp_path / "native").glob("*.tmp")), "the temporary output is removed"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_is_torchs_first_maximum(dtype):
    """The greedy sampler's kernel: the first index among equal maxima, the first NaN
    of a row that has one, 0 for a row of -inf, inf beating every finite value, row
    lengths around the 16-lane vectors, strided rows; the same as max(-1).indices."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 5, 16, 17, 31, 49152):
        x = torch.randn(4, n, generator=g).to(dtype)
        assert torch.equal(cpu_ops.argmax(x), x.max(-1).indices), n
    x = torch.randn(8, 1000, generator=g).to(dtype)
    x[0, 100] = x[0].max() + 1
    x[0, 700] = x[0, 100]             # a tie: the first wins, also across vector lanes
    x[1, 7] = x[1, 3] = float("nan")  # the first NaN, in the vector part
    x[2, 998] = float("nan")          # a NaN in the scalar tail
    x[3] = float("-inf")
    x[4] = 2.0                        # all equal
    x[5, 901] = float("inf")
    rows = x[:, 5:997]                # strided rows, a length that leaves a tail
    for t in (x, rows):
        assert torch.equal(cpu_ops.argmax(t), t.max(-1).indices)
    assert cpu_ops.argmax(x).tolist()[:6] == [100, 3, 998, 0, 0, 901]
    from vllm.sample.metadata import greedy_sample
    assert torch.equal(greedy_sample(x), x.max(-1).indices)
