"""--cpu-offload-gb on the fake HPU: decoder layers in host memory, copied into one
staging copy on the device as each runs; the freed device memory goes to the KV cache,
outputs are unchanged and HPU graphs capture nothing after warmup. Refused on CPU and
for a negative value, by name."""
from __future__ import annotations

import gc

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from vllm import SamplingParams
from vllm.hpu import habana
from vllm.model_executor.cpu_offload import find_decoder_layers

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
MODEL = dict(num_hidden_layers=4, intermediate_size=512)
"""Layers that weigh more than their share of the (large) embedding and LM head."""


def _run(path: str, lazy: str, **kwargs) -> tuple[list[list[int]], dict]:
    # A small device, so the KV cache is sized by what the weights leave free; what
    # earlier tests in this process left on the fake device's ledger is forgotten first
    # (in the whole suite it took most of the 30 MiB, and the KV cache came out at 128
    # tokens).
    habana.reset_tracked_memory()
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE=lazy, VLLM_FAKE_HPU_MEMORY_GB="0.03",
               VLLM_GRAPH_RESERVED_MEM="0.1")
    with platform_env("hpu", **env):
        llm = make_llm(model=path, enable_prefix_caching=False, **kwargs)
        runner = runner_of(llm)
        worker = llm.llm_engine.engine_core.executor.worker
        out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY,
                                                                  use_tqdm=False)]
        layer = find_decoder_layers(runner.model)[0]
        facts = dict(
            free=worker.memory_budget.free,
            blocks=llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
            weights=sum(p.numel() * p.element_size() for p in
                        {p.data_ptr(): p for p in runner.model.parameters()}.values()),
            layer=sum(p.numel() * p.element_size() for p in layer.parameters()),
            offloaded=runner.cpu_offload.layers,
            saved=runner.cpu_offload.device_bytes_saved,
            compiles=llm.llm_engine.get_compile_stats()["num_compiles_after_warmup"])
        del runner, worker, layer  # the ledger frees the weights with their tensors
        release(llm)
        del llm
        gc.collect()
    return out, facts


@pytest.mark.parametrize("lazy", ["1", "0"], ids=["hpu-graphs", "torch-compile"])
def test_offloaded_layers_free_device_memory_for_kv_blocks(tiny_model_factory, lazy):
    path = tiny_model_factory("llama", **MODEL)
    expected, base = _run(path, lazy)
    gb = 3.5 * base["layer"] / (1 << 30)  # three whole layers fit
    out, offl = _run(path, lazy, cpu_offload_gb=gb)
    assert out == expected
    assert offl["offloaded"] == [0, 1, 2]
    saved = 2 * base["layer"]  # three layers in host memory, one staging copy on device
    assert offl["saved"] == saved
    assert base["weights"] - offl["weights"] == saved
    assert offl["free"] - base["free"] == saved  # what the KV cache sizing saw
    assert offl["blocks"] > base["blocks"]
    assert offl["compiles"] == base["compiles"] == 0


def test_refused_on_cpu_and_when_negative(tiny_model_factory):
    from vllm.engine.arg_utils import EngineArgs
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        with pytest.raises(ValueError, match="cpu_offload_gb=1.0 is not supported on CPU"):
            EngineArgs(model=path, cpu_offload_gb=1.0).create_engine_config()
        with pytest.raises(ValueError, match="cpu_offload_gb must be >= 0"):
            EngineArgs(model=path, cpu_offload_gb=-1).create_engine_config()
    with platform_env("hpu"):
        with pytest.raises(ValueError, match="cpu_offload_gb=1.0 cannot be combined with "
                                             "enable_sleep_mode"):
            EngineArgs(model=path, cpu_offload_gb=1.0,
                       enable_sleep_mode=True).create_engine_config()
