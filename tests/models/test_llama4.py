"""Llama 4's language model (`Llama4ForCausalLM`) against transformers on tiny random
checkpoints: whole-prompt logits, greedy tokens and top-5 logprobs through the engine
(prompts longer than several attention chunks, chunked prefill across chunk
boundaries), TP=2 equal to one process, and the fake HPU equal to CPU with 0 compiles
after warmup. The checkpoints exercise what Llama 4 adds: chunked local attention (a
chunk of 8 positions), NoPE layers with temperature tuning (a floor scale of 4 so it
varies at test lengths), the L2 q/k norm, interleaved dense / MoE layers, a top-1
router scaling the expert input, and a shared expert."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.models._model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from tests.models._tiny_families import save_tiny
from tests.models.test_breadth_hf import assert_matches_transformers, run_engine
from tests.models.test_deepseek import _tp_worker
from vllm.model_executor.model_loader import get_model

CASES = {
    "moe-interleaved": dict(num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                            intermediate_size=32, intermediate_size_mlp=128,
                            num_local_experts=4, num_experts_per_tok=1,
                            interleave_moe_layer_step=2, attention_chunk_size=8,
                            floor_scale=4, attn_scale=0.5),
    "no-qk-norm-all-moe": dict(num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                               intermediate_size=32, intermediate_size_mlp=128,
                               num_local_experts=4, num_experts_per_tok=1,
                               interleave_moe_layer_step=1, attention_chunk_size=8,
                               use_qk_norm=False, attn_temperature_tuning=False),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(case: str) -> str:
        if case not in cache:
            cache[case] = save_tiny(str(tmp_path_factory.mktemp(case)), "Llama4TextConfig",
                                    **CASES[case])
        return cache[case]
    return get


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_logits_match_transformers(case, tiny):
    path = tiny(case)
    ids = prompt_ids(40)  # five attention chunks
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)


def test_greedy_and_logprobs_match_transformers(tiny):
    path = tiny("moe-interleaved")
    ids, results = run_engine(path)
    assert_matches_transformers(path, results, ids)


def test_chunked_prefill_across_attention_chunks(tiny):
    """12-token prefill steps cut the 8-position attention chunks at varying offsets."""
    path = tiny("moe-interleaved")
    ids, results = run_engine(path, max_num_batched_tokens=12)
    assert_matches_transformers(path, results, ids)


@pytest.mark.timeout(300)
def test_tp2_matches_one_process(tiny, tmp_path):
    from tests.models.test_parallel import _free_port
    ids = prompt_ids(24)
    cases = [("tp2-llama4", tiny("moe-interleaved"), False)]
    expected = {name: full_prompt_logits(get_model(make_vllm_config(path)), ids)
                for name, path, _ in cases}
    mp.spawn(_tp_worker, args=(2, f"tcp://127.0.0.1:{_free_port()}",
                               [(n, p, ep, ids) for n, p, ep in cases], str(tmp_path)),
             nprocs=2, join=True)
    for name, _, _ in cases:
        for rank in range(2):
            r = torch.load(tmp_path / f"{name}-{rank}.pt")
            torch.testing.assert_close(r["logits"], expected[name], atol=1e-4, rtol=1e-4)


def test_fake_hpu_equals_cpu_without_compiles(tiny):
    from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
    from tests.hpu.test_hpu_models import GREEDY, LENGTHS
    buckets = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
               "VLLM_PROMPT_SEQ_BUCKET_MAX": "64", "VLLM_DECODE_BS_BUCKET_MAX": "4"}
    results = []
    for target, env in (("cpu", {}), ("hpu", buckets)):
        with platform_env(target, **env):
            llm = make_llm(model=tiny("moe-interleaved"), block_size=16,
                           kv_cache_memory_bytes=16 << 20, max_model_len=128, max_num_seqs=4)
            try:
                prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                    use_tqdm=False)
                results.append([list(o.outputs[0].token_ids) for o in outs])
                if target == "hpu":
                    assert runner_of(llm).num_compiles_after_warmup == 0
            finally:
                release(llm)
    assert results[0] == results[1]


def test_multimodal_checkpoint_serves_its_language_model(tmp_path):
    """A Llama4ForConditionalGeneration checkpoint (vision tower included) runs as its
    language model alone with --limit-mm-per-prompt {"image": 0} (vision not built) and
    gives transformers' text-only tokens; an image is then refused naming the limit."""
    import transformers
    from tests.models._tiny_families import BASE, _save_tokenizer
    from vllm import LLM, SamplingParams
    text = dict({k: v for k, v in BASE.items()}, **CASES["moe-interleaved"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14,
                  vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    config = transformers.Llama4Config(text_config=text, vision_config=vision,
                                       image_token_index=BASE["vocab_size"] - 1)
    torch.manual_seed(0)
    hf = transformers.Llama4ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    path = str(tmp_path / "llama4-mm")
    hf.save_pretrained(path)
    _save_tokenizer(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    # transformers' own language model of the checkpoint (its multimodal class's
    # text-only generate is broken in transformers 5.24)
    ref = hf.language_model
    with torch.no_grad():
        expected = ref.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
    llm = LLM(path, dtype="float32", max_model_len=128, limit_mm_per_prompt={"image": 0},
              kv_cache_memory_bytes=16 << 20)
    try:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": ids[0].tolist()}], params, use_tqdm=False)
        assert list(out[0].outputs[0].token_ids) == expected.tolist()
        with pytest.raises(ValueError, match="allows no images"):
            from tests.multimodal.conftest import random_image
            llm.generate({"prompt": "Look", "multi_modal_data": {"image": random_image(0, 8, 8)}},
                         params, use_tqdm=False)
        model = llm.llm_engine.engine_core.executor.worker.model_runner.model
        assert not hasattr(model, "vision_model")  # neither built nor loaded
    finally:
        llm.llm_engine.shutdown()
