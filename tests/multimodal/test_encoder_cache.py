"""Encoder cache and encoder budget (vllm/multimodal/encoder_cache.py) and image hashes
in prefix-cache block keys: unit level, then through the engine."""
from __future__ import annotations

import pytest

from tests.multimodal.conftest import hf_greedy, random_image
from vllm import LLM, SamplingParams
from vllm.multimodal.encoder_cache import EncoderCacheManager, schedule_encoder_inputs
from vllm.multimodal.inputs import MultiModalFeature


def _feat(key: str, offset: int, length: int) -> MultiModalFeature:
    return MultiModalFeature(modality="image", identifier=key, offset=offset, length=length)


def test_budget_cuts_the_chunk_before_an_image_that_does_not_fit():
    m = EncoderCacheManager(capacity=100)
    feats = [_feat("a", 2, 10), _feat("b", 20, 10)]
    n, todo, left = schedule_encoder_inputs(m, "r", feats, 0, 40, budget=15)
    assert (n, [f.identifier for f in todo], left) == (20, ["a"], 5)
    # Nothing fits and the chunk starts at the image: nothing is scheduled.
    assert schedule_encoder_inputs(m, "r", feats[1:], 20, 20, budget=5)[0] == 0


def test_cached_images_cost_nothing_and_eviction_is_reported():
    m = EncoderCacheManager(capacity=20)
    m.allocate("r1", "a", 10)
    n, todo, left = schedule_encoder_inputs(m, "r2", [_feat("a", 0, 10)], 0, 12, budget=3)
    assert (n, todo, left) == (12, [], 3)
    m.allocate("r1", "b", 10)
    assert not m.can_allocate(5)  # both in use
    m.release("r1", [_feat("a", 0, 10), _feat("b", 0, 10)])
    assert m.can_allocate(15)
    m.allocate("r3", "c", 15)  # evicts a, then b (oldest first)
    assert m.take_freed() == ["a", "b"] and m.take_freed() == []
    assert m.is_cached("c") and not m.is_cached("a")


def _count_encoder_runs(worker):
    """Wrap the model's embed_multimodal to count the images it encodes."""
    model = worker.model_runner.model
    if not hasattr(model, "_encoded"):
        model._encoded = []
        inner = model.embed_multimodal

        def counted(items):
            model._encoded.append(len(items))
            return inner(items)
        model.embed_multimodal = counted
    return sum(model._encoded)


@pytest.fixture(scope="module")
def chunked_llm(tiny_llava):
    # 8-token steps: each 16-token image spans several steps.
    return LLM(tiny_llava, dtype="float32", max_model_len=512, max_num_batched_tokens=8,
               limit_mm_per_prompt={"image": 2})


def test_chunked_prefill_encodes_each_image_once_and_matches_transformers(chunked_llm,
                                                                          tiny_llava):
    prompt = "USER: <image> and <image> compare. ASSISTANT:"
    images = [random_image(11, 48, 32), random_image(12, 32, 80)]
    before = chunked_llm.collective_rpc(_count_encoder_runs)[0]
    out = chunked_llm.generate({"prompt": prompt, "multi_modal_data": {"image": images}},
                               SamplingParams(max_tokens=6, temperature=0.0,
                                              ignore_eos=True), use_tqdm=False)[0]
    assert chunked_llm.collective_rpc(_count_encoder_runs)[0] - before == 2
    assert list(out.outputs[0].token_ids) == hf_greedy(
        tiny_llava, "LlavaForConditionalGeneration", prompt, images, 6)


def test_same_image_reuses_blocks_and_a_different_image_never_does(chunked_llm):
    prompt = "USER: <image> tell me a long story about it please. ASSISTANT:"
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    first, second = random_image(21, 32, 32), random_image(22, 32, 32)

    def run(image):
        return chunked_llm.generate({"prompt": prompt, "multi_modal_data": {"image": image}},
                                    params, use_tqdm=False)[0]
    assert run(first).num_cached_tokens == 0
    before = chunked_llm.collective_rpc(_count_encoder_runs)[0]
    again = run(first.copy())  # equal pixels, another object: same hash
    assert again.num_cached_tokens > 0
    assert chunked_llm.collective_rpc(_count_encoder_runs)[0] == before  # cache hit
    assert run(second).num_cached_tokens == 0  # the image sits in the first block


def test_preempted_image_requests_resume_with_the_same_tokens(tiny_llava):
    # 8 blocks of 16 tokens for two requests that grow to ~75 and ~50 tokens: one is
    # preempted, its encoder outputs released, and it is recomputed from its images.
    llm = LLM(tiny_llava, dtype="float32", max_model_len=128, num_gpu_blocks_override=8,
              enable_prefix_caching=False, limit_mm_per_prompt={"image": 2})
    prompts = [("USER: <image> and <image> compare. ASSISTANT:",
                [random_image(1, 64, 64), random_image(2, 24, 48)]),
               ("USER: <image> describe it. ASSISTANT:", [random_image(3, 40, 40)])]
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": i}} for t, i in prompts],
                        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    assert llm.llm_engine.get_stats().num_preemptions > 0
    for (text, images), out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(
            tiny_llava, "LlavaForConditionalGeneration", text, images, 30)
