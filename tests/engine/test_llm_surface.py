"""The rest of vLLM's offline surface: vllm.__all__, vllm.inputs, LLM.enqueue /
enqueue_chat / wait_for_completion, get_metrics, get_world_size, from_engine_args."""
from __future__ import annotations

import pytest

import vllm
from vllm import LLM, EngineArgs, SamplingParams
from vllm.inputs import TextPrompt, TokensPrompt
from vllm.metrics.reader import Counter, Histogram

VLLM_032_ALL = {"__version__", "__version_tuple__", "LLM", "ModelRegistry", "PromptType",
                "TextPrompt", "TokensPrompt", "SamplingParams", "RequestOutput",
                "CompletionOutput", "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput",
                "EmbeddingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput",
                "ScoringOutput", "ScoringRequestOutput", "LLMEngine", "EngineArgs",
                "AsyncLLMEngine", "AsyncEngineArgs", "initialize_ray_cluster", "PoolingParams"}


def test_public_names_match_vllm():
    assert set(vllm.__all__) == VLLM_032_ALL
    for name in vllm.__all__:
        assert getattr(vllm, name) is not None


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    return LLM(model=tiny_model_factory("llama"), dtype="float32", disable_log_stats=False,
               max_model_len=256)


def test_prompt_types_and_refusals(llm):
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    ids = llm.get_tokenizer().encode("the cat sat")
    by_text = llm.generate(TextPrompt(prompt="the cat sat"), greedy, use_tqdm=False)[0]
    by_ids = llm.generate(TokensPrompt(prompt_token_ids=ids), greedy, use_tqdm=False)[0]
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    for prompt, field in [({"prompt_embeds": [[0.0]]}, "prompt_embeds"),
                          ({"prompt": "x", "multi_modal_data": {"image": 1}},
                           "multi_modal_data")]:
        with pytest.raises(ValueError, match=field):
            llm.generate(prompt, greedy, use_tqdm=False)


def test_enqueue_then_wait_for_completion(llm):
    greedy = SamplingParams(max_tokens=3, temperature=0.0)
    first = llm.enqueue(["hello there", "the cat"], greedy, use_tqdm=False)
    # A generate() in between runs the queued requests too; their outputs are kept.
    assert len(llm.generate("x", greedy, use_tqdm=False)) == 1
    second = llm.enqueue_chat([{"role": "user", "content": "hi"}], greedy,
                              chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    outs = llm.wait_for_completion(use_tqdm=False)
    assert [o.request_id for o in outs] == first + second
    assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
    assert llm.wait_for_completion(use_tqdm=False) == []
    with pytest.raises(ValueError, match="priority"):
        llm.enqueue("x", greedy, priority=1)


def test_get_metrics_counts_tokens(tiny_model_factory):
    llm = LLM(model=tiny_model_factory("llama"), dtype="float32", disable_log_stats=False,
              max_model_len=256)
    prompts = ["one two three", "four five"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    metrics = {m.name: m for m in llm.get_metrics()
               if "finished_reason" not in m.labels}
    gen = metrics["vllm:generation_tokens"]
    assert isinstance(gen, Counter) and gen.value == 10
    assert metrics["vllm:prompt_tokens"].value == sum(len(o.prompt_token_ids) for o in outs)
    e2e = metrics["vllm:e2e_request_latency_seconds"]
    assert isinstance(e2e, Histogram) and e2e.count == 2 and e2e.buckets["+Inf"] == 2
    quiet = LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=256)
    with pytest.raises(ValueError, match="disable_log_stats=False"):
        quiet.get_metrics()


def test_world_size_and_from_engine_args(tiny_model_factory):
    llm = LLM.from_engine_args(EngineArgs(model=tiny_model_factory("llama"), dtype="float32",
                                          max_model_len=128))
    assert llm.llm_engine.model_config.max_model_len == 128
    assert llm.get_world_size() == llm.get_world_size(include_dp=False) == 1


def test_dashboard_metrics(tiny_model_factory):
    """vllm:request_num_preemptions, request_prefill_kv_computed_tokens,
    prompt_tokens_by_source and cache_config_info, on a KV cache small enough to preempt."""
    llm = LLM(model=tiny_model_factory("llama"), dtype="float32", disable_log_stats=False,
              max_model_len=128, block_size=16, num_gpu_blocks_override=8)
    prompts = [{"prompt_token_ids": [100 + 7 * i + j for j in range(30)]} for i in range(4)]
    params = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0)
    outs = llm.generate(prompts, params, use_tqdm=False)  # 4 x 2 blocks, then growth
    short = {"prompt_token_ids": list(range(200, 220))}
    outs += llm.generate([short], SamplingParams(max_tokens=2), use_tqdm=False)
    again = llm.generate([short], SamplingParams(max_tokens=2), use_tqdm=False)  # cached
    metrics = llm.get_metrics()
    by = {(m.name, m.labels.get("source")): m for m in metrics}
    preempt = by[("vllm:request_num_preemptions", None)]
    total = by[("vllm:num_preemptions", None)].value
    assert total > 0 and preempt.count == 6 and preempt.sum == total
    cached = again[0].num_cached_tokens
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs + again)
    hit = by[("vllm:prompt_tokens_by_source", "local_cache_hit")].value
    computed = by[("vllm:prompt_tokens_by_source", "local_compute")].value
    assert cached > 0 and hit >= cached and hit + computed == prompt_tokens
    assert by[("vllm:prompt_tokens_by_source", "external_kv_transfer")].value == 0
    kv = by[("vllm:request_prefill_kv_computed_tokens", None)]
    assert kv.count == 6 and kv.sum == computed
    info = by[("vllm:cache_config_info", None)]
    assert info.value == 1 and info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == "8" and info.labels["enable_prefix_caching"] == "True"


def test_batch_defaults_on_cpu_follow_vllm(tiny_model_factory):
    """vLLM's CPU defaults: 4096 tokens / 256 sequences a step offline, 2048 / 128 for the
    server (per rank); explicit values and pooling's whole-prompt budget win."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    model = tiny_model_factory("llama")

    def budget(cls, **kw):
        sc = cls(model=model, max_model_len=128, device="cpu", **kw).create_engine_config(
        ).scheduler_config
        return sc.max_num_seqs, sc.max_num_batched_tokens

    assert budget(EngineArgs) == (256, 4096)
    assert budget(AsyncEngineArgs) == (128, 2048)
    assert budget(AsyncEngineArgs, max_num_seqs=8, max_num_batched_tokens=512) == (8, 512)
    assert budget(EngineArgs, max_num_seqs=300) == (300, 4096)
    assert budget(EngineArgs, enable_chunked_prefill=False) == (256, 256)
