"""Per-platform custom ops: which kernels each platform's model runs, and torch.compile.

- On the fake HPU the model calls the hpex kernels of the shim (FusedRMSNorm,
  apply_rotary_pos_emb, FusedSDPA) and never a CPU-native kernel; on CPU the native
  kernels run and the hpex ones do not (the kernels are counted where they are called).
- A Llama decoder layer on CPU, compiled with torch.compile(fullgraph=True), traces
  the native kernels as opaque custom ops (a graph break would raise) and two batches
  of different data run without a recompile, with the eager layer's results.
"""
from __future__ import annotations

import collections
from typing import Any

import pytest
import torch

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release
from vllm import SamplingParams
from vllm.hpu import habana
from vllm.model_executor.custom_op import CustomOp
from vllm.cpu import cpu_ops, loader

pytestmark = pytest.mark.skipif(not cpu_ops.supports(torch.float32),
                                reason="native CPU kernels unavailable")

NATIVE_KERNELS = ("vllm_rms_norm", "vllm_rotary", "vllm_silu_and_mul", "vllm_write_kv",
                  "vllm_decode_attention", "vllm_gemm_bf16_packed",
                  "vllm_llama_decode_layer")
HPU_KERNELS = ("FusedRMSNorm", "apply_rotary_pos_emb", "FusedSDPA")


class _CountingLib:
    """Stands in for the loaded native library; counts each kernel it hands out."""

    def __init__(self, lib: Any, calls: collections.Counter) -> None:
        self._lib, self._calls = lib, calls

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._lib, name)
        if name not in NATIVE_KERNELS:
            return fn

        def call(*args: Any) -> Any:
            self._calls[name] += 1
            return fn(*args)
        return call


def _count_kernels(monkeypatch) -> collections.Counter:
    calls: collections.Counter = collections.Counter()
    monkeypatch.setitem(loader._state, "lib", _CountingLib(loader.get_native_lib(), calls))

    def counted(name: str, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    for name in ("FusedRMSNorm", "FusedSDPA"):
        kernel = getattr(habana, name)
        monkeypatch.setattr(habana, name, type(name, (), {
            "apply": staticmethod(counted(name, kernel.apply))}))
    monkeypatch.setattr(habana, "apply_rotary_pos_emb",
                        counted("apply_rotary_pos_emb", habana.apply_rotary_pos_emb))
    return calls


PROMPTS = ["The capital of France is", "Once upon a time, " * 10]
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")


def _generate_counting(path: str, monkeypatch, target: str, **env: str):
    with platform_env(target, **env):
        llm = make_llm(model=path, max_num_seqs=4, kv_cache_memory_bytes=4 << 20,
                       enforce_eager=True)
        layer = llm.llm_engine.engine_core.executor.worker.model_runner.model.model.layers[0]
        methods = {type(m).__name__: m.forward_method_name for m in layer.modules()
                   if isinstance(m, CustomOp)}
        calls = _count_kernels(monkeypatch)
        out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY,
                                                                  use_tqdm=False)]
        monkeypatch.undo()
        release(llm)
    return out, calls, methods


def test_fake_hpu_runs_the_hpex_kernels_and_cpu_the_native_ones(tiny_llama, monkeypatch):
    cpu_out, cpu_calls, cpu_methods = _generate_counting(tiny_llama, monkeypatch, "cpu")
    hpu_out, hpu_calls, hpu_methods = _generate_counting(tiny_llama, monkeypatch, "hpu",
                                                         PT_HPU_LAZY_MODE="0",
                                                         **SMALL_BUCKETS)
    # The native kernels bound by the CPU platform (vllm/cpu/ops.py).
    assert cpu_methods == {"RMSNorm": "rms_norm_cpu", "SiluAndMul": "silu_and_mul_cpu",
                           "RotaryEmbedding": "rotary_embedding_cpu"}
    # The HPU kernels bound by register_ops (vllm/hpu/ops.py);
    # silu_and_mul has none (Gaudi's graph compiler fuses it): its forward_native.
    assert hpu_methods == {"RMSNorm": "rms_norm_hpu", "SiluAndMul": "forward_native",
                           "RotaryEmbedding": "rotary_embedding_hpu"}
    for name in ("vllm_rms_norm", "vllm_rotary", "vllm_silu_and_mul", "vllm_write_kv",
                 "vllm_decode_attention"):
        assert cpu_calls[name] > 0, (name, cpu_calls)
    assert not any(cpu_calls[k] for k in HPU_KERNELS), cpu_calls
    for name in HPU_KERNELS:
        assert hpu_calls[name] > 0, (name, hpu_calls)
    assert not any(hpu_calls[k] for k in NATIVE_KERNELS), hpu_calls
    assert hpu_out == cpu_out


def test_the_implementation_is_chosen_once_from_the_platform():
    """Built under the fake HPU, a layer keeps the HPU kernel after the platform
    changes: nothing is decided per call from the tensors (which are CPU tensors)."""
    from vllm.model_executor.layers.layernorm import RMSNorm
    with platform_env("hpu"):
        on_hpu = RMSNorm(16)
    with platform_env("cpu"):
        on_cpu = RMSNorm(16)
    assert on_hpu.forward_method_name == "rms_norm_hpu"
    assert on_cpu.forward_method_name == "rms_norm_cpu"
    x = torch.randn(3, 16)
    torch.testing.assert_close(on_hpu(x), on_cpu(x))


def test_an_out_of_tree_op_replaces_the_in_tree_class():
    from vllm.model_executor.layers.activation import SiluAndMul

    class PluginSilu(SiluAndMul):
        def forward_oot(self, x):
            return super().forward_native(x) * 0

    with pytest.raises(ValueError, match="no in-tree custom op named 'nope'"):
        CustomOp.register_oot("nope")(PluginSilu)
    try:
        CustomOp.register_oot()(PluginSilu)
        op = SiluAndMul()
        assert type(op) is PluginSilu
        # The plugin took the op over: its forward runs on the CPU platform too, in
        # place of the native kernel bound there.
        assert op.forward_method_name == "forward_oot"
        assert torch.count_nonzero(op(torch.randn(3, 8))) == 0
    finally:
        CustomOp.entry("silu_and_mul").oot = None
    assert type(SiluAndMul()) is SiluAndMul


def _decoder_layer(dtype: torch.dtype):
    import transformers

    from vllm.model_executor.models.llama import LlamaDecoderLayer
    from vllm.model_executor.layers.rotary_embedding import get_rope
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    with platform_env("cpu"):
        layer = LlamaDecoderLayer(config, get_rope(16, 16, 256, 10000.0),
                                  prefix="model.layers.0")
    for p in layer.parameters():
        p.data.normal_(0, 0.2)
    return layer.to(dtype)


def _decode_batch(seed: int, dtype: torch.dtype, n: int = 3, block_size: int = 8,
                  num_blocks: int = 16):
    """Hidden states, residual, positions and native decode metadata for n decodes."""
    import numpy as np

    from vllm.attention.backends.torch_sdpa import build_metadata
    g = torch.Generator().manual_seed(seed)
    lens = np.sort(torch.randint(2, 3 * block_size, (n,), generator=g).numpy())
    table = np.stack([torch.randperm(num_blocks, generator=g).numpy()[:3]
                      for _ in range(n)]).astype(np.int64)
    positions = torch.from_numpy(lens - 1)
    slots = torch.from_numpy(table[np.arange(n), (lens - 1) // block_size] * block_size
                             + (lens - 1) % block_size)
    md = build_metadata(slots, table, lens, [], [], block_size, "cpu", native=True)
    hidden = torch.randn(n, 64, generator=g).to(dtype)
    residual = torch.randn(n, 64, generator=g).to(dtype)
    cache = torch.randn(2, 2, num_blocks * block_size, 16, generator=g).to(dtype)
    return positions, hidden, residual, md, cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_decoder_layer_traces_native_ops_without_breaks_or_recompiles(
        dtype, monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters

    from vllm.attention.selector import get_attn_backend
    from vllm.forward_context import set_forward_context
    layer = _decoder_layer(dtype)
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=False)
    calls = _count_kernels(monkeypatch)
    for seed in (1, 2):  # same shapes, different data (values, positions, block tables)
        positions, hidden, residual, md, cache = _decode_batch(seed, dtype)
        eager_cache = cache.clone()
        with set_forward_context(md, [eager_cache], get_attn_backend()):
            ref = layer(positions, hidden.clone(), residual.clone())
        traced_before = calls["vllm_rms_norm"]
        with set_forward_context(md, [cache], get_attn_backend()):
            got = compiled(positions, hidden.clone(), residual.clone())
        assert calls["vllm_rms_norm"] > traced_before  # the compiled graph ran the kernel
        for a, b in zip(got, ref):
            assert torch.equal(a, b)
        assert torch.equal(cache, eager_cache)  # K/V written through the opaque op
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    for name in ("vllm_rms_norm", "vllm_rotary", "vllm_silu_and_mul", "vllm_write_kv",
                 "vllm_decode_attention"):
        assert calls[name] > 0, (name, calls)
