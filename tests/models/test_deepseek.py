"""DeepSeek-V2 / V2-Lite / V3 (MLA + DeepSeek MoE) against transformers on tiny random
checkpoints: whole-prompt logits without a cache, then 6 prompts x 32 greedy tokens
identical and top-5 logprobs within 1e-3 (fp32) through the whole engine (latent KV
cache, decode by weight absorption); the latent cache's size; decode with and without
absorption; chunked prefill over a cached context; an fp8 latent cache against
transformers with the latent quantize-dequantized; TP=2 and expert parallel."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.models._model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from tests.models._tiny_families import save_tiny
from tests.engine.conftest import PROMPTS, hf_greedy
from tests.models.test_breadth_hf import (NEW_TOKENS, assert_matches_transformers,
                                          greedy_with_logprobs, run_engine)
from vllm.model_executor.model_loader import get_model

MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
           v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
CASES = {
    # Low-rank q, softmax top-k (no renormalization), a dense first layer, 2 shared experts.
    "v2": ("DeepseekV2Config", dict(MLA, q_lora_rank=48, n_shared_experts=2,
                                    first_k_dense_replace=1, routed_scaling_factor=1.5)),
    # V2-Lite: q_proj (no q_lora_rank); group-limited greedy routing.
    "v2-lite": ("DeepseekV2Config", dict(MLA, q_lora_rank=None, n_shared_experts=1,
                                         topk_method="group_limited_greedy", n_group=4,
                                         topk_group=2)),
    # V3: sigmoid + correction bias, group-limited top-k renormalized, scaling factor,
    # a dense first layer, YaRN rotary with mscale (softmax scale corrected too).
    "v3": ("DeepseekV3Config", dict(
        MLA, q_lora_rank=48, n_shared_experts=1, n_group=4, topk_group=2,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=256, mscale=1.0,
                             mscale_all_dim=1.0, beta_fast=32, beta_slow=1))),
}


def _randomize_correction_bias(path: str) -> None:
    """HF initializes V3's e_score_correction_bias to zeros: make it matter."""
    from safetensors.torch import load_file, save_file
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    gen = torch.Generator().manual_seed(1)
    for name, t in tensors.items():
        if name.endswith("e_score_correction_bias"):
            tensors[name] = torch.rand(t.shape, generator=gen) * 0.5
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(case: str) -> str:
        if case not in cache:
            cls, fields = CASES[case]
            path = save_tiny(str(tmp_path_factory.mktemp(case)), cls, **fields)
            if case == "v3":
                _randomize_correction_bias(path)
            cache[case] = path
        return cache[case]
    return get


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_logits_match_transformers(case, tiny):
    path = tiny(case)
    ids = prompt_ids(40)
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_and_logprobs_match_transformers(case, tiny):
    path = tiny(case)
    ids, results = run_engine(path)
    assert_matches_transformers(path, results, ids)


def _runner(llm):
    return llm.llm_engine.engine_core.executor.worker.model_runner


def test_latent_cache_holds_one_latent_head(tiny):
    """A block holds kv_lora_rank + qk_rope_head_dim per token and layer, not
    2 * heads * head_dim."""
    from vllm import LLM
    cfg = CASES["v2"][1]
    llm = LLM(model=tiny("v2"), dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=4 << 20, block_size=16)
    runner = _runner(llm)
    latent = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    layers, elem = 2, 4
    assert runner.get_kv_cache_block_bytes() == layers * 16 * latent * elem
    expanded = 2 * 4 * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) * layers * 16 * elem
    assert expanded / runner.get_kv_cache_block_bytes() == 4.8  # 24576 vs 5120 bytes
    assert runner.num_kv_blocks == (4 << 20) // runner.get_kv_cache_block_bytes()
    cache = runner.kv_caches[0]
    assert tuple(cache.shape) == (1, 1, runner.num_kv_blocks * 16, latent)
    llm.llm_engine.shutdown()


def _set_absorb(worker, value: bool) -> int:
    from vllm.attention.mla import MLAAttention
    layers = [m for m in worker.model_runner.model.modules() if isinstance(m, MLAAttention)]
    for m in layers:
        m.absorb = value
    return len(layers)


@pytest.mark.parametrize("native", [True, False], ids=["native-decode", "torch-decode"])
def test_decode_with_and_without_absorption_agree(tiny, native, monkeypatch):
    """Decodes that expand every cached latent give the same tokens and logprobs as the
    absorbed ones (chunked prefill: 16-token chunks attend to a cached context). Absorbed
    decodes run the native paged decode kernel over the latent, or torch ops."""
    from vllm import LLM
    from vllm.cpu import cpu_ops  # the CPU's paged_decode_attention kernel calls it
    calls = []
    real = cpu_ops.decode_attention
    monkeypatch.setattr(cpu_ops, "decode_attention",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    if not native:
        monkeypatch.setattr(cpu_ops, "usable", lambda t: False)
    llm = LLM(model=tiny("v2"), dtype="float32", max_model_len=512,
              kv_cache_memory_bytes=32 << 20, block_size=16, max_num_batched_tokens=16,
              max_num_seqs=4)
    tok = llm.get_tokenizer()
    ids = [tok.encode(" ".join(PROMPTS[i:i + 3]))[:n] for i, n in ((0, 40), (3, 23))]
    absorbed = greedy_with_logprobs(llm, ids)
    assert bool(calls) == native
    assert llm.collective_rpc(_set_absorb, args=(False,)) == [2]
    expanded = greedy_with_logprobs(llm, ids)
    llm.llm_engine.shutdown()
    assert_matches_transformers(tiny("v2"), absorbed, ids)
    for (t1, lp1), (t2, lp2) in zip(absorbed, expanded):
        assert t1 == t2
        for a, b in zip(lp1, lp2):
            for tid, lp in a.items():
                assert abs(lp.logprob - b[tid].logprob) < 1e-4


def test_fp8_latent_cache_matches_quantized_reference(tiny, monkeypatch):
    """--kv-cache-dtype fp8: the latent [c | k_pe] is stored as e4m3; the reference is
    transformers with c (after kv_a_layernorm) and the rotated k_pe quantize-dequantized."""
    import transformers
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as mod
    from vllm import LLM
    path = tiny("v2")

    def qdq(x):
        return x.to(torch.float8_e4m3fn).to(x.dtype)
    rotary = mod.apply_rotary_emb
    monkeypatch.setattr(mod, "apply_rotary_emb",
                        lambda q, k, f: (lambda qk: (qk[0], qdq(qk[1])))(rotary(q, k, f)))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for layer in hf.model.layers:
        layer.self_attn.kv_a_layernorm.register_forward_hook(lambda m, i, o: qdq(o))
    llm = LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=8 << 20,
              block_size=16, kv_cache_dtype="fp8")
    assert _runner(llm).kv_caches[0].dtype == torch.float8_e4m3fn
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS[:3]]
    results = greedy_with_logprobs(llm, ids)
    llm.llm_engine.shutdown()
    for prompt, (tokens, logprobs) in zip(ids, results):
        ref_ids, ref_lps = hf_greedy(hf, prompt, NEW_TOKENS)
        assert tokens == ref_ids
        for lp, ref in zip(logprobs, ref_lps):
            vals, tids = ref.topk(5)
            for tid, val in zip(tids.tolist(), vals.tolist()):
                assert abs(lp[tid].logprob - val) < 2e-3


def _tp_worker(rank: int, world: int, init_method: str, cases: list, out_dir: str) -> None:
    torch.set_num_threads(1)
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  init_distributed_environment, initialize_model_parallel)
    init_distributed_environment(world, rank, init_method, rank, "gloo")
    try:
        for name, path, ep, ids in cases:
            initialize_model_parallel(2, 1)
            config = make_vllm_config(path, tp=2)
            config.parallel_config.enable_expert_parallel = ep
            model = get_model(config)
            experts = next((m for m in model.modules() if hasattr(m, "local_num_experts")),
                           None)
            torch.save({"logits": full_prompt_logits(model, ids),
                        "local_experts": experts and experts.local_num_experts,
                        "w13": experts and tuple(experts.w13_weight.shape)},
                       os.path.join(out_dir, f"{name}-{rank}.pt"))
            destroy_model_parallel()
    finally:
        destroy_distributed_environment()


@pytest.mark.timeout(300)
def test_tp2_and_expert_parallel_match_single_process(tiny, tmp_path):
    """DeepSeek with TP=2 (heads and experts' intermediate size split) and expert
    parallel; in the same process group the other new families' TP=2 (fused
    query_key_value layouts split by head: Falcon's KV groups and its one multi-query
    head replicated, GPT-NeoX's per-head rows; InternLM2's packed wqkv; GraniteMoE)."""
    from tests.models._tiny_families import internlm2_from_llama
    from tests.models.test_new_families import CASES as FAMILIES
    from tests.models.test_parallel import _free_port
    ids = prompt_ids(24)
    cases = [("tp2-v2", tiny("v2"), False), ("tp2-v3", tiny("v3"), False),
             ("ep2-v3", tiny("v3"), True), ("ep2-v2-lite", tiny("v2-lite"), True)]
    for family in ("falcon-new-arch", "falcon-multi-query", "gpt_neox", "granitemoe"):
        cls, fields = FAMILIES[family]
        cases.append((family, save_tiny(str(tmp_path / family), cls, **fields), False))
    llama = save_tiny(str(tmp_path / "llama"), "LlamaConfig", num_key_value_heads=2,
                      rms_norm_eps=1e-6, attention_bias=True)
    cases.append(("internlm2", internlm2_from_llama(llama, str(tmp_path / "internlm2"),
                                                    bias=True), False))
    expected = {name: full_prompt_logits(get_model(make_vllm_config(path)), ids)
                for name, path, _ in cases}
    mp.spawn(_tp_worker, args=(2, f"tcp://127.0.0.1:{_free_port()}",
                               [(n, p, ep, ids) for n, p, ep in cases], str(tmp_path)),
             nprocs=2, join=True)
    for name, _, ep in cases:
        for rank in range(2):
            r = torch.load(tmp_path / f"{name}-{rank}.pt")
            torch.testing.assert_close(r["logits"], expected[name], atol=1e-4, rtol=1e-4)
            if name.startswith(("tp2-", "ep2-")):
                # EP: 4 whole experts per rank; TP: all 8, half of each intermediate dim.
                assert r["local_experts"] == (4 if ep else 8), name
                assert r["w13"][1] == (64 if ep else 32), name


def test_enable_expert_parallel_flag_reaches_the_parallel_config(tiny):
    import argparse
    from vllm.engine.arg_utils import EngineArgs
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model", tiny("v2"), "--enable-expert-parallel"])
    assert ns.enable_expert_parallel is True
    config = EngineArgs(model=tiny("v2"), enable_expert_parallel=True).create_engine_config()
    assert config.parallel_config.enable_expert_parallel is True
    assert config.model_config.use_mla and config.model_config.get_head_size() == 40
