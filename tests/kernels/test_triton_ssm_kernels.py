"""The CUDA platform's Triton kernels of the state-space / linear-attention ops
(vllm/cuda/ssm_kernels.py) against the torch ops they replace
(vllm/model_executor/layers/mamba/ops.py), on CPU through Triton's interpreter (the
code a GPU compiles; no GPU here); with VLLM_TEST_TRITON_DEVICE=cuda on a GPU. Random
inputs of several shapes (batch 1 and 3, odd head and state sizes, strided views as the
mixers pass), float32; the step ops both returning a new state (the input left alone)
and updating a slot cache in place at `state_slots` (the other slots untouched); the
prefill scans from random states over padded sequences (T not a multiple of the chunk),
and the gated norm in its three forms."""
from __future__ import annotations

import os

import pytest
import torch

from vllm.attention.ops.triton_reshape_and_cache import HAS_TRITON
from vllm.model_executor.layers.mamba import ops

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

DEVICE = os.environ.get("VLLM_TEST_TRITON_DEVICE", "cpu")

if HAS_TRITON:
    from vllm.cuda import ssm_kernels


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want.cpu(), atol=2e-5, rtol=2e-5)


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE)


def _check_step(name: str, args: tuple, state: torch.Tensor, slots: list[int],
                num_slots: int) -> None:
    """The Triton op equals the torch op, functional and on slots of a cache."""
    torch_op, triton_op = getattr(ops, name), getattr(ssm_kernels, name)
    before = state.clone()
    want_y, want_state = torch_op(*args, state)
    got_y, got_state = triton_op(*args, state)
    _close(got_y, want_y)
    _close(got_state, want_state)
    assert torch.equal(state, before)  # the input state is left alone
    # in place, on the slots of a cache (other slots untouched)
    cache = _rand(num_slots, *state.shape[1:])
    idx = torch.tensor(slots, device=DEVICE)
    cache[idx] = state
    want_cache, got_cache = cache.clone(), cache.clone()
    want_y2, ret = torch_op(*args, want_cache, state_slots=idx)
    assert ret is want_cache
    got_y2, ret = triton_op(*args, got_cache, state_slots=idx)
    assert ret is got_cache
    _close(got_y2, want_y)
    _close(want_y2, want_y)
    _close(got_cache[idx], want_state)
    _close(got_cache, want_cache)
    others = torch.ones(num_slots, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(got_cache[others.to(DEVICE)], cache[others.to(DEVICE)])


@pytest.mark.parametrize("batch,channels,width,bias", [(1, 37, 4, True), (3, 70, 3, False)])
def test_causal_conv1d_step(batch, channels, width, bias):
    torch.manual_seed(0)
    wide = _rand(batch, channels + 9)
    x = wide[:, 5:5 + channels]  # a strided view, as the mixer's split
    w = _rand(channels, 1, width).view(channels, width)
    b = _rand(channels) if bias else None
    state = _rand(batch, channels, width - 1)
    _check_step("causal_conv1d_step", (x, w, b), state, [4, 0, 2][:batch], 5)


@pytest.mark.parametrize("batch,heads,groups,head_dim,state_size",
                         [(1, 3, 1, 5, 16), (3, 4, 2, 24, 19)])
def test_ssd_step(batch, heads, groups, head_dim, state_size):
    torch.manual_seed(1)
    xbc = _rand(batch, heads * head_dim + 2 * groups * state_size)
    x, B, C = xbc.split([heads * head_dim, groups * state_size, groups * state_size], -1)
    x = x.reshape(batch, heads, head_dim)
    B = B.reshape(batch, groups, state_size)
    C = C.reshape(batch, groups, state_size)
    dt = torch.nn.functional.softplus(_rand(batch, heads))
    A, D = -torch.exp(_rand(heads)), _rand(heads)
    state = _rand(batch, heads, head_dim, state_size)
    _check_step("ssd_step", (x, dt, A, B, C, D), state, [1, 6, 3][:batch], 7)


@pytest.mark.parametrize("batch,channels,state_size", [(1, 33, 16), (3, 50, 7)])
def test_selective_step(batch, channels, state_size):
    torch.manual_seed(2)
    x = _rand(batch, channels)
    dt = torch.nn.functional.softplus(_rand(batch, channels))
    A = -torch.exp(_rand(channels, state_size))
    B, C, D = _rand(batch, state_size), _rand(batch, state_size), _rand(channels)
    state = _rand(batch, channels, state_size)
    _check_step("selective_step", (x, dt, A, B, C, D), state, [2, 0, 3][:batch], 4)


@pytest.mark.parametrize("batch,heads,dk,dv", [(1, 2, 16, 24), (3, 3, 20, 13)])
def test_gated_delta_rule_step(batch, heads, dk, dv):
    torch.manual_seed(3)
    q = torch.nn.functional.normalize(_rand(batch, heads, dk), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(_rand(batch, heads, dk), dim=-1)
    v = _rand(batch, heads + 1, dv)[:, 1:]  # strided heads
    g = -torch.rand(batch, heads, device=DEVICE)
    beta = torch.rand(batch, heads, device=DEVICE)
    state = _rand(batch, heads, dk, dv)
    _check_step("gated_delta_rule_step", (q, k, v, g, beta), state, [0, 5, 1][:batch], 6)


@pytest.mark.parametrize("batch,seq,channels,width,bias,lengths",
                         [(1, 9, 37, 4, True, None), (3, 40, 70, 4, False, [40, 1, 17]),
                          (3, 2, 20, 3, True, [2, 0, 1])])
def test_causal_conv1d_prefill(batch, seq, channels, width, bias, lengths):
    """The padded prefill conv: output and the new state at each sequence's end."""
    torch.manual_seed(4)
    x = _rand(batch, seq, channels + 3)[..., 3:]
    w = _rand(channels, width)
    b = _rand(channels) if bias else None
    state = _rand(batch, channels, width - 1)
    lens = None if lengths is None else torch.tensor(lengths, device=DEVICE)
    want = ops.causal_conv1d(x, w, b, state, lens)
    got = ssm_kernels.causal_conv1d(x, w, b, state, lens)
    valid = torch.ones(batch, seq, dtype=torch.bool)
    if lengths is not None:
        valid = torch.arange(seq).view(1, seq) < torch.tensor(lengths).view(batch, 1)
    valid = valid.to(DEVICE)
    _close(got[0][valid], want[0][valid])  # padding positions: any value
    _close(got[1], want[1])


def _valid(batch: int, seq: int, lengths) -> torch.Tensor:
    """[b, T] True at each sequence's tokens (padding after its length)."""
    if lengths is None:
        return torch.ones(batch, seq, dtype=torch.bool, device=DEVICE)
    return (torch.arange(seq).view(1, seq)
            < torch.tensor(lengths).view(batch, 1)).to(DEVICE)


def _close_scan(got: tuple, want: tuple) -> None:
    """A scan's outputs and final state: float32, equal to rounding (the Triton scans
    run the recurrence token by token, the torch ops chunk by chunk)."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float32 and g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w.cpu(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("batch,seq,channels,state_size,lengths",
                         [(1, 13, 33, 16, None), (3, 21, 50, 7, [21, 1, 10])])
def test_selective_scan(batch, seq, channels, state_size, lengths):
    """Mamba1's prefill scan from a random state; padding (dt = 0) keeps the state."""
    torch.manual_seed(5)
    x = _rand(batch, seq, channels + 4)[..., 4:]  # strided channels
    dt = torch.nn.functional.softplus(_rand(batch, seq, channels))
    dt = dt * _valid(batch, seq, lengths).unsqueeze(-1)
    A = -torch.exp(_rand(channels, state_size))
    bc = _rand(batch, seq, 2 * state_size + 3)
    B, C = bc[..., 3:3 + state_size], bc[..., 3 + state_size:]
    D, state = _rand(channels), _rand(batch, channels, state_size)
    before = state.clone()
    args = (x, dt, A, B, C, D, state)
    _close_scan(ssm_kernels.selective_scan(*args), ops.selective_scan(*args))
    assert torch.equal(state, before)


@pytest.mark.parametrize("batch,seq,heads,groups,head_dim,state_size,chunk,lengths",
                         [(1, 13, 3, 1, 5, 16, 8, None),
                          (3, 21, 4, 2, 24, 19, 8, [21, 1, 10])])
def test_ssd_chunk_scan(batch, seq, heads, groups, head_dim, state_size, chunk, lengths):
    """Mamba2's prefill scan (strided x, B, C as the mixer's split of the conv output)
    from a random state, T not a multiple of the chunk; padding keeps the state."""
    torch.manual_seed(6)
    gn = groups * state_size
    xbc = _rand(batch, seq, heads * head_dim + 2 * gn)
    x, B, C = xbc.split([heads * head_dim, gn, gn], -1)
    x = x.reshape(batch, seq, heads, head_dim)
    B = B.reshape(batch, seq, groups, state_size)
    C = C.reshape(batch, seq, groups, state_size)
    dt = torch.nn.functional.softplus(_rand(batch, seq, heads))
    dt = dt * _valid(batch, seq, lengths).unsqueeze(-1)
    A, D = -torch.exp(_rand(heads)), _rand(heads)
    state = _rand(batch, heads, head_dim, state_size)
    args = (x, dt, A, B, C, D, chunk, state)
    _close_scan(ssm_kernels.ssd_chunk_scan(*args), ops.ssd_chunk_scan(*args))
    # a bfloat16 state cache's rows: read as the torch op reads them
    args = (x, dt, A, B, C, D, chunk, state.bfloat16())
    _close_scan(ssm_kernels.ssd_chunk_scan(*args), ops.ssd_chunk_scan(*args))


@pytest.mark.parametrize("batch,seq,heads,dk,dv,chunk,lengths",
                         [(1, 13, 2, 16, 24, 8, None), (3, 21, 3, 20, 13, 8, [21, 1, 10])])
def test_gated_delta_rule_chunked(batch, seq, heads, dk, dv, chunk, lengths):
    """The Gated DeltaNet prefill (strided v) from a random state; padding (g = beta =
    0) keeps the state."""
    torch.manual_seed(7)
    F = torch.nn.functional
    q = F.normalize(_rand(batch, seq, heads, dk), dim=-1) * dk ** -0.5
    k = F.normalize(_rand(batch, seq, heads, dk), dim=-1)
    v = _rand(batch, seq, heads + 1, dv)[:, :, 1:]
    valid = _valid(batch, seq, lengths).unsqueeze(-1)
    g = -torch.rand(batch, seq, heads, device=DEVICE) * valid
    beta = torch.rand(batch, seq, heads, device=DEVICE) * valid
    state = _rand(batch, heads, dk, dv)
    args = (q, k, v, g, beta, state, chunk)
    _close_scan(ssm_kernels.gated_delta_rule_chunked(*args),
                ops.gated_delta_rule_chunked(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["gate", "none", "gate_after"])
def test_gated_rms_norm(mode, dtype):
    """x * silu(gate) normalized per group (strided gate, as the mixer's split of the
    projection), without a gate, and Falcon-H1's gate after the norm; the torch op's
    result dtype (bf16 x, fp32 weight: fp32 unless the gate comes after)."""
    torch.manual_seed(8)
    x = _rand(2, 5, 48).to(dtype)
    gate = _rand(2, 5, 60)[..., 6:54].to(dtype)
    weight = _rand(48)
    kwargs = {"gate_after": gate} if mode == "gate_after" else {}
    gate_in = gate if mode == "gate" else None
    want = ops.gated_rms_norm(x, gate_in, weight, 16, 1e-5, **kwargs)
    got = ssm_kernels.gated_rms_norm(x, gate_in, weight, 16, 1e-5, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.float32:
        _close(got, want)
    else:  # an element may round to the neighbouring bf16 value before the weight
        torch.testing.assert_close(got.float().cpu(), want.float().cpu(),
                                   atol=(weight.abs().max() * 2 ** -6).item(), rtol=0)
    # one group of many channels: the kernel loops over it in blocks
    x = _rand(3, 2500)
    w = _rand(2500)
    _close(ssm_kernels.gated_rms_norm(x, None, w, 2500, 1e-6),
           ops.gated_rms_norm(x, None, w, 2500, 1e-6))


def test_the_cuda_kernel_table_binds_them_and_cpu_and_hpu_keep_theirs():
    """On CUDA the mixers' ops resolve to the Triton kernels; the HPU keeps the torch
    ops, the CPU its native decode steps (vllm/cpu/state_ops.py) and torch for the rest
    (inspecting the table; no GPU needed)."""
    from vllm.cpu import state_ops
    from vllm.cpu.ops import register_cpu_ops
    from vllm.cuda import ops as cuda_ops
    from vllm.model_executor import kernels
    from vllm.platforms.cuda import CudaPlatform
    CudaPlatform().bind_custom_ops()
    register_cpu_ops()
    cpu_native = {"ssd_step", "causal_conv1d_step", "gated_delta_rule_step"}
    expected = {"causal_conv1d": ssm_kernels.causal_conv1d,
                "causal_conv1d_step": ssm_kernels.causal_conv1d_step,
                "ssd_step": ssm_kernels.ssd_step,
                "selective_step": ssm_kernels.selective_step,
                "gated_delta_rule_step": ssm_kernels.gated_delta_rule_step,
                "selective_scan": ssm_kernels.selective_scan,
                "ssd_chunk_scan": ssm_kernels.ssd_chunk_scan,
                "gated_delta_rule_chunked": ssm_kernels.gated_delta_rule_chunked,
                "gated_rms_norm": ssm_kernels.gated_rms_norm}
    assert {k: cuda_ops.CUDA_KERNELS[k] for k in expected} == expected
    for name, fn in expected.items():
        assert kernels.kernel(name, "cuda") is fn
        assert kernels.kernel(name, "cpu") is getattr(
            state_ops if name in cpu_native else ops, name)
        assert kernels.kernel(name, "hpu") is getattr(ops, name)
    for name in kernels.SSM_OPS:
        assert name in kernels._defaults
        if name not in expected:  # no Triton kernel yet: the torch op on CUDA too
            assert kernels.kernel(name, "cuda") is getattr(ops, name)


def test_launches_compile_for_sm90(monkeypatch):
    """Compile every kernel the ops launch (bf16 activations, float32 states, slots and
    not) for sm_90 ahead of time: the interpreter accepts what a GPU may reject."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tests.kernels.test_triton_attention import _compile_for_sm90, _Recorder
    names = ("_CONV1D", "_CONV1D_STEP", "_SSD_STEP", "_SELECTIVE_STEP", "_GATED_DELTA_STEP",
             "_SELECTIVE_SCAN", "_SSD_SCAN", "_GATED_DELTA_SCAN", "_GATED_RMS_NORM")
    recorders = {name: _Recorder(getattr(ssm_kernels, name)) for name in names}
    for name in names:
        monkeypatch.setattr(ssm_kernels, name, recorders[name])
    bf = torch.bfloat16
    slots = torch.tensor([3, 1], dtype=torch.int64)
    w = torch.zeros(256, 4, dtype=bf)
    ssm_kernels.causal_conv1d(torch.zeros(1, 300, 256, dtype=bf), w, torch.zeros(256, dtype=bf),
                              torch.zeros(1, 256, 3, dtype=bf))
    ssm_kernels.causal_conv1d(torch.zeros(2, 30, 256, dtype=bf), w, None,
                              torch.zeros(2, 256, 3, dtype=bf), torch.tensor([30, 4]))
    for s in (None, slots):
        ssm_kernels.causal_conv1d_step(torch.zeros(2, 256, dtype=bf), w,
                                       torch.zeros(256, dtype=bf),
                                       torch.zeros(4, 256, 3, dtype=bf), s)
        ssm_kernels.ssd_step(torch.zeros(2, 8, 64, dtype=bf), torch.zeros(2, 8),
                             torch.zeros(8), torch.zeros(2, 1, 128, dtype=bf),
                             torch.zeros(2, 1, 128, dtype=bf), torch.zeros(8),
                             torch.zeros(4, 8, 64, 128), s)
        ssm_kernels.selective_step(torch.zeros(2, 256, dtype=bf), torch.zeros(2, 256),
                                   torch.zeros(256, 16), torch.zeros(2, 16, dtype=bf),
                                   torch.zeros(2, 16, dtype=bf), torch.zeros(256),
                                   torch.zeros(4, 256, 16), s)
        ssm_kernels.gated_delta_rule_step(torch.zeros(2, 4, 128), torch.zeros(2, 4, 128),
                                          torch.zeros(2, 4, 128, dtype=bf),
                                          torch.zeros(2, 4), torch.zeros(2, 4),
                                          torch.zeros(4, 4, 128, 128, dtype=bf), s)
    # the prefill scans (Mamba1 with 8192 channels, Mamba2 heads of 64 x 128 states,
    # Qwen3-Next's 128 x 128 delta-rule states) and the gated norms (bf16 activations)
    ssm_kernels.selective_scan(torch.zeros(2, 30, 8192, dtype=bf), torch.zeros(2, 30, 8192),
                               torch.zeros(8192, 16), torch.zeros(2, 30, 16, dtype=bf),
                               torch.zeros(2, 30, 16, dtype=bf), torch.zeros(8192),
                               torch.zeros(2, 8192, 16))
    ssm_kernels.ssd_chunk_scan(torch.zeros(2, 30, 8, 64, dtype=bf), torch.zeros(2, 30, 8),
                               torch.zeros(8), torch.zeros(2, 30, 1, 128, dtype=bf),
                               torch.zeros(2, 30, 1, 128, dtype=bf), torch.zeros(8), 256,
                               torch.zeros(2, 8, 64, 128, dtype=bf))
    ssm_kernels.gated_delta_rule_chunked(torch.zeros(2, 30, 4, 128), torch.zeros(2, 30, 4, 128),
                                         torch.zeros(2, 30, 4, 128, dtype=bf),
                                         torch.zeros(2, 30, 4), torch.zeros(2, 30, 4),
                                         torch.zeros(2, 4, 128, 128), 64)
    y, gate = torch.zeros(30, 4096), torch.zeros(30, 4096, dtype=bf)
    ssm_kernels.gated_rms_norm(y, gate, torch.zeros(4096, dtype=bf), 4096, 1e-5)
    ssm_kernels.gated_rms_norm(y.bfloat16(), None, torch.zeros(4096, dtype=bf), 512, 1e-5,
                               gate_after=gate)
    launches = [launch for r in recorders.values() for launch in r.launches]
    assert len(launches) == 15
    for fn, args, kwargs in launches:
        _compile_for_sm90(fn, args, dict(kwargs))


def _generate(path: str, prompts: list[list[int]]):
    from vllm import LLM, SamplingParams
    llm = LLM(model=path, dtype="float32", block_size=16, max_model_len=128, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params,
                        use_tqdm=False)
    llm.llm_engine.shutdown()
    return [(list(o.outputs[0].token_ids),
             [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs])
            for o in outs]


@pytest.mark.skipif(DEVICE != "cpu", reason="binds the kernels for the CPU platform")
@pytest.mark.parametrize("family", ["mamba2", "jamba", "qwen3_next"])
def test_mixers_through_the_table_equal_the_torch_ops(family, tmp_path, monkeypatch):
    """A tiny model of each mixer family (Mamba2, Mamba1, Gated DeltaNet) served with
    the Triton kernels bound in the table (the CPU platform's entries here, run by the
    interpreter) gives the torch ops' greedy tokens and logprobs: the mixers call
    through the table (prefills: the conv, the scans, Mamba2's gated norm), batched
    decodes update their slots in place."""
    from tests.models.test_jamba import save_jamba
    from tests.models.test_qwen3_next import save_qwen3_next
    from vllm.cuda.ops import CUDA_KERNELS
    from vllm.model_executor import kernels
    if family == "mamba2":
        import transformers
        from tests.models._tiny_families import _save_tokenizer
        from tests.models.test_mamba2 import MAMBA2
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.Mamba2Config(**{**MAMBA2, "num_hidden_layers": 1}),
            dtype=torch.float32)
        model.save_pretrained(str(tmp_path), safe_serialization=True)
        _save_tokenizer(str(tmp_path))
        path = str(tmp_path)
    else:
        path = (save_jamba if family == "jamba" else save_qwen3_next)(str(tmp_path))
    prompts = [[(7 * i + 3 * k) % 4000 + 100 for i in range(n)]
               for k, n in enumerate((1, 9, 20))]
    want = _generate(path, prompts)
    table = kernels._bound.setdefault("cpu", {})
    calls: dict[str, int] = {}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call
    for name, fn in CUDA_KERNELS.items():
        monkeypatch.setitem(table, name, counted(name, fn))
    got = _generate(path, prompts)
    ops_used = {"mamba2": ["ssd_chunk_scan", "ssd_step", "gated_rms_norm"],
                "jamba": ["selective_scan", "selective_step"],
                "qwen3_next": ["gated_delta_rule_chunked", "gated_delta_rule_step"]}[family]
    assert sorted(calls) == sorted(["causal_conv1d", "causal_conv1d_step", *ops_used])
    for (tokens, lps), (want_tokens, want_lps) in zip(got, want):
        assert tokens == want_tokens
        for step, want_step in zip(lps, want_lps):
            assert step.keys() == want_step.keys()
            for t in step:
                assert abs(step[t] - want_step[t]) < 1e-4
