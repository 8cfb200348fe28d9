"""LLaVA on the fake HPU: the CPU platform's greedy tokens for prompts with 1 and 2
images of different sizes, the vision encoder on warmed image-count buckets, and no
graph compile after warmup."""
from __future__ import annotations

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.multimodal.conftest import random_image
from vllm import SamplingParams
from vllm.hpu.mm_encoder import image_buckets

ARGS = dict(max_model_len=512, max_num_seqs=4, block_size=16, kv_cache_memory_bytes=1 << 20,
            limit_mm_per_prompt={"image": 3})


def _prompts():
    return [{"prompt": "USER: <image> what is it? ASSISTANT:",
             "multi_modal_data": {"image": random_image(41, 20, 36)}},
            {"prompt": "USER: <image> or <image>? ASSISTANT:",
             "multi_modal_data": {"image": [random_image(42, 64, 48), random_image(43, 30, 30)]}},
            {"prompt": "USER: <image><image><image> all three. ASSISTANT:",
             "multi_modal_data": {"image": [random_image(44, 32, 32), random_image(45, 50, 90),
                                            random_image(46, 16, 16)]}}]


def _generate(llm):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = llm.generate(_prompts(), params, use_tqdm=False)
    one_by_one = [llm.generate(p, params, use_tqdm=False)[0] for p in _prompts()[::-1]]
    return ([list(o.outputs[0].token_ids) for o in first],
            [list(o.outputs[0].token_ids) for o in one_by_one[::-1]])


def test_image_buckets():
    assert image_buckets(1) == [1] and image_buckets(3) == [1, 2, 4]


def test_fake_hpu_matches_cpu_and_compiles_nothing_after_warmup(tiny_llava):
    with platform_env("cpu"):
        llm = make_llm(model=tiny_llava, **ARGS)
        try:
            cpu = _generate(llm)
        finally:
            release(llm)
    env = dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1")
    with platform_env("hpu", **env):
        llm = make_llm(model=tiny_llava, **ARGS)
        try:
            tracker = runner_of(llm).tracker
            warmed = " ".join(tracker.compiled_labels[False])
            for size in (1, 2, 4):
                assert f"vision {size} images" in warmed
            hpu = _generate(llm)
            assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
        finally:
            release(llm)
    assert hpu == cpu
    assert cpu[0] == cpu[1]  # batched or alone, with prefix and encoder cache hits
