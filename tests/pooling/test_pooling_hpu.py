"""Pooling on the fake HPU: encoder and decoder embedders on bucketed prompt passes
(HPU graphs), vectors equal to the CPU runner's, nothing compiled after warmup."""
from __future__ import annotations

import pytest
import torch

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.pooling.test_pooling_offline import TEXTS, _cos

ARGS = dict(max_model_len=128, max_num_seqs=4, block_size=16, kv_cache_memory_bytes=1 << 20)


def _embed(path: str, target: str, prompts: list, **kwargs) -> tuple[list, dict]:
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1") if target == "hpu" else {}
    with platform_env(target, **env):
        llm = make_llm(model=path, **ARGS, **kwargs)
        try:
            outs = [o.outputs.embedding for o in llm.embed(prompts, use_tqdm=False)]
            stats = {}
            if target == "hpu":
                runner = runner_of(llm)
                tracker = runner.tracker
                warmed = " ".join(tracker.compiled_labels[False])
                stats = dict(after=tracker.num_compiles_after_warmup,
                             compiled=tracker.compiled_labels[True],
                             warmed_pooler="pooler " in warmed,
                             warmed_decode="decode " in warmed,
                             replays=runner.num_graph_replays)
            return outs, stats
        finally:
            release(llm)


@pytest.mark.parametrize("kind", ["bert-mean", "xlmr", "qwen3"])
def test_hpu_embeddings_bucketed_without_compiles(encoder_factory, tiny_model_factory, kind):
    if kind == "qwen3":
        path, extra = tiny_model_factory("qwen3"), {"runner": "pooling"}
    else:
        path = encoder_factory("bert", "MEAN") if kind == "bert-mean" else encoder_factory(
            "xlmr")
        extra = {}
    prompts = TEXTS * 2 + [{"prompt_token_ids": [7]}]  # batches of several sizes
    cpu, _ = _embed(path, "cpu", prompts, **extra)
    hpu, stats = _embed(path, "hpu", prompts, **extra)
    for a, b in zip(cpu, hpu):
        assert _cos(a, b) > 1 - 1e-5
    assert stats["warmed_pooler"] and not stats["warmed_decode"]
    assert stats["after"] == 0, stats["compiled"]
    assert stats["replays"] > 0
    torch.testing.assert_close(torch.tensor(hpu[0]), torch.tensor(hpu[len(TEXTS)]))
