"""KV offloading (--kv-offloading-size): on the fake HPU, a device KV cache too small to
keep a set of prompts loses them, and sending one again takes its prefix back from host
memory (counted as host hits, loaded blocks, Prometheus) with the greedy outputs of the
run without offloading; with HPU graphs (no layer-by-layer wait inside a replayed
graph) too. The flags' errors name what is wrong: CPU, lmcache, a bad size, state-space
and MLA models."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from tests.models.test_mamba2 import mamba2_path  # noqa: F401 (fixture)
from vllm import SamplingParams
from vllm.engine.metrics import StatsTracker

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
ARGS = dict(block_size=16, num_gpu_blocks_override=12, max_num_seqs=2, max_model_len=128)
"""12 device blocks of 16 tokens: two 68-token requests at a time, not four prompts."""


def _serve(llm, prompts):
    """Each prompt alone, in order; (tokens, num_cached_tokens) of each."""
    outs = []
    for p in prompts:
        o = llm.generate([{"prompt_token_ids": p}], GREEDY, use_tqdm=False)[0]
        outs.append((list(o.outputs[0].token_ids), o.num_cached_tokens))
    return outs


def _run(path, env, **kwargs):
    with platform_env("hpu", VLLM_SKIP_WARMUP="1", **env):
        llm = make_llm(model=path, **ARGS, **kwargs)
        try:
            prompts = ragged_prompt_ids(llm.get_tokenizer(), [60, 60, 60, 60])
            # Four prompts evict each other's blocks; the first two come back.
            outs = _serve(llm, prompts + prompts[:2])
            stats = llm.llm_engine.get_stats()
            connector = runner_of(llm).kv_connector
            return outs, stats, connector
        finally:
            release(llm)


@pytest.mark.parametrize("env", [{}, {"PT_HPU_LAZY_MODE": "1"}],
                         ids=["layerwise", "hpu-graphs"])
def test_evicted_prefix_comes_back_from_host_memory(tiny_model_factory, env):
    path = tiny_model_factory("llama")
    reference, ref_stats, _ = _run(path, env)
    outs, stats, connector = _run(path, env, kv_offloading_size=0.001)
    assert [o[0] for o in outs] == [r[0] for r in reference]
    # Without offloading the device lost them: nothing cached on the second pass.
    assert [r[1] for r in reference] == [0] * 6 and ref_stats.prefix_cache_hits == 0
    # With it: the three full blocks before each re-sent prompt's last token.
    assert [o[1] for o in outs] == [0, 0, 0, 0, 48, 48]
    assert stats.prefix_cache_hits == 0  # the device cache did not keep them
    assert stats.external_prefix_cache_hits == 96
    assert stats.kv_offload["loaded_blocks"] == 6
    assert stats.kv_offload["stored_blocks"] >= 16  # 4 full blocks of each prompt
    assert not connector._copier._thread.is_alive()  # stopped with its engine

    tracker = StatsTracker("m", 128, log_stats=False)
    tracker.on_scheduler_stats(stats)
    text = _exposition(tracker)
    assert 'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 96.0' in text
    assert 'vllm:kv_offload_loaded_blocks_total{engine="0",model_name="m"} 6.0' in text
    assert (f'vllm:kv_offload_load_bytes_total{{engine="0",model_name="m"}} '
            f'{6.0 * stats.kv_offload["block_bytes"]}') in text


def _exposition(tracker) -> str:
    from prometheus_client import generate_latest
    return generate_latest(tracker.registry).decode()


# ------------------------------------------------------------------ refusals
def test_cpu_refuses_by_name(tiny_model_factory):
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        with pytest.raises(ValueError, match="kv-offloading-size.*meaningless on CPU"):
            make_llm(model=path, kv_offloading_size=1.0, **ARGS)


@pytest.mark.parametrize("kwargs, message", [
    ({"kv_offloading_size": 1.0, "kv_offloading_backend": "lmcache"},
     "kv_offloading_backend='lmcache' is not supported"),
    ({"kv_offloading_size": -1.0}, "kv_offloading_size must be a positive"),
    ({"kv_offloading_size": 0.0}, "kv_offloading_size must be a positive"),
    ({"kv_offloading_backend": "disk"}, "kv_offloading_backend='disk'"),
])
def test_config_errors_name_the_field(kwargs, message):
    from vllm.config import CacheConfig
    with pytest.raises(ValueError) as err:
        CacheConfig(**kwargs)
    assert message in str(err.value)


def test_server_flags_parse():
    """`vllm serve` takes the flags (its parser holds EngineArgs'); lmcache parses and is
    refused when the config is built (above)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    args = make_arg_parser().parse_args(
        ["--kv-offloading-size", "2.5", "--kv-offloading-backend", "native"])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.kv_offloading_size == 2.5
    assert engine_args.kv_offloading_backend == "native"
    with pytest.raises(SystemExit):  # not a number of GiB
        make_arg_parser().parse_args(["--kv-offloading-size", "lots"])


def test_host_pool_is_lru_and_spares_the_steps_loads():
    from vllm.kv_transfer.offloading_connector import HostBlockPool
    pool = HostBlockPool(2)
    a, b = pool.allocate(101, set()), pool.allocate(102, set())
    assert {a, b} == {0, 1} and len(pool) == 2
    assert pool.lookup(101) == a  # 101 is now the most recently used
    assert pool.allocate(103, set()) == b and pool.lookup(102) is None
    # The least recently used (101) is being loaded this step: 103's block goes instead.
    assert pool.allocate(104, {a}) == b and pool.lookup(103) is None
    assert pool.allocate(105, {a, b}) is None  # nothing may be evicted


def test_state_space_and_mla_models_refuse_by_name(request, tmp_path):
    from tests.hpu.test_hpu_mla import V3
    from tests.models._tiny_families import save_tiny
    mla = save_tiny(str(tmp_path / "ds-v3"), "DeepseekV3Config", **V3)
    with platform_env("hpu", VLLM_SKIP_WARMUP="1"):
        with pytest.raises(ValueError, match="not supported for MLA models"):
            make_llm(model=mla, kv_offloading_size=0.01, **ARGS)
        with pytest.raises(ValueError, match="state-space layers \\(MambaSpec"):
            make_llm(model=request.getfixturevalue("mamba2_path"), kv_offloading_size=0.01,
                     **ARGS)


def test_host_memory_outlives_sleep(tiny_model_factory):
    """Sleep frees the device cache (the last step's stores finish first) and forgets the
    device prefix cache; the prefixes come back from host memory after the wake-up."""
    path = tiny_model_factory("llama")
    with platform_env("hpu", VLLM_SKIP_WARMUP="1"):
        llm = make_llm(model=path, kv_offloading_size=0.001, enable_sleep_mode=True, **ARGS)
        try:
            prompts = ragged_prompt_ids(llm.get_tokenizer(), [60, 60])
            before = _serve(llm, prompts)
            llm.sleep(level=1)
            llm.wake_up()
            after = _serve(llm, prompts)
            stats = llm.llm_engine.get_stats()
        finally:
            release(llm)
    assert [a[0] for a in after] == [b[0] for b in before]
    assert [a[1] for a in after] == [48, 48]
    assert stats.prefix_cache_hits == 0 and stats.external_prefix_cache_hits == 96


def test_a_failed_store_fails_one_load_then_recomputes(tiny_model_factory):
    """A store that failed leaves host blocks without KV: the request that would load
    them ends with finish reason "error" (never sampled from a wrong cache), the host
    entries are forgotten, and the next request with that prefix computes it."""
    path = tiny_model_factory("llama")
    with platform_env("hpu", VLLM_SKIP_WARMUP="1"):
        llm = make_llm(model=path, kv_offloading_size=0.001, **ARGS)
        try:
            prompts = ragged_prompt_ids(llm.get_tokenizer(), [60, 60, 60, 60])
            view = runner_of(llm).kv_connector.kv_caches["layers.0"]

            def broken(slots):
                raise RuntimeError("injected store failure")

            view.read = broken  # every store of the first prompt fails
            first = _serve(llm, prompts[:1])
            del view.read
            _serve(llm, prompts[1:])  # evicts the first prompt from the device
            failed = llm.generate([{"prompt_token_ids": prompts[0]}], GREEDY,
                                  use_tqdm=False)[0]
            again = _serve(llm, prompts[:1])
        finally:
            release(llm)
    assert failed.outputs[0].finish_reason == "error" and not failed.outputs[0].token_ids
    assert again == [(first[0][0], 0)]  # recomputed: no host hit, the same tokens
