"""Qwen3-VL and Qwen3-VL-MoE on the fake HPU: the CPU platform's greedy tokens for prompts with 0, 1, 2
and 3 images of different sizes (batched and one by one), the DeepStack features riding
in the fixed-shape prompt passes' input embeddings, the vision tower on warmed
patch-count buckets, and no graph compile after warmup."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.multimodal.conftest import QWEN_VL_IMAGE, make_tiny_qwen3_vl, random_image
from vllm import SamplingParams

ARGS = dict(max_model_len=256, max_num_seqs=4, block_size=16, kv_cache_memory_bytes=1 << 20,
            limit_mm_per_prompt={"image": 3})


def _prompts():
    img = QWEN_VL_IMAGE
    return [{"prompt": f"User: {img} what is it? Assistant:",
             "multi_modal_data": {"image": random_image(41, 20, 36)}},
            {"prompt": f"User: {img} or {img}? Assistant:",
             "multi_modal_data": {"image": [random_image(42, 64, 48), random_image(43, 30, 30)]}},
            {"prompt": f"User: {img}{img}{img} all three. Assistant:",
             "multi_modal_data": {"image": [random_image(44, 32, 32), random_image(45, 50, 90),
                                            random_image(46, 16, 16)]}},
            "User: no picture here. Assistant:"]


def _generate(llm):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = llm.generate(_prompts(), params, use_tqdm=False)
    one_by_one = [llm.generate(p, params, use_tqdm=False)[0] for p in _prompts()[::-1]]
    return ([list(o.outputs[0].token_ids) for o in first],
            [list(o.outputs[0].token_ids) for o in one_by_one[::-1]])


@pytest.mark.parametrize("moe", [False, True])
def test_fake_hpu_matches_cpu_and_compiles_nothing_after_warmup(tmp_path, moe):
    tiny = make_tiny_qwen3_vl(str(tmp_path), moe=moe)
    with platform_env("cpu"):
        llm = make_llm(model=tiny, **ARGS)
        try:
            cpu = _generate(llm)
        finally:
            release(llm)
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1")
    with platform_env("hpu", **env):
        llm = make_llm(model=tiny, **ARGS)
        try:
            runner = runner_of(llm)
            tracker = runner.tracker
            warmed = " ".join(tracker.compiled_labels[False])
            assert runner.vision_encoder.buckets == [64, 128, 256]  # up to 144-patch images
            for size in runner.vision_encoder.buckets:
                assert f"vision {size} patches" in warmed
            hpu = _generate(llm)
            assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
        finally:
            release(llm)
    assert hpu == cpu
    assert cpu[0] == cpu[1]  # batched or alone, with prefix and encoder cache hits
