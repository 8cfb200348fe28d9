"""GPT-OSS (`GptOssForCausalLM`) against transformers on tiny random checkpoints:
whole-prompt logits without a cache, 6 prompts x 32 greedy tokens identical and top-5
logprobs within 1e-3 (fp32) through the whole engine (paged cache, sliding-window
layers shorter than the prompts), TP=2 and expert parallel equal to one process, and
an MXFP4 checkpoint in the published layout (written here by our own quantizer) equal
to the model on its dequantized weights.

The checkpoint covers what GPT-OSS adds to a Llama decoder: q/k/v/o biases, per-head
attention sinks, alternating sliding-window (8) / full layers, YaRN rotary, a router
with bias, experts with biases, interleaved gate/up columns and the clamped SwiGLU
(a small `swiglu_limit`, so the clamps bite). HF initializes biases to zero and sinks
near zero: they are randomized so that they matter."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.models._model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from tests.models._tiny_families import save_tiny
from tests.models.test_breadth_hf import assert_matches_transformers, run_engine
from tests.models.test_deepseek import _tp_worker
from vllm.model_executor.model_loader import get_model

GPT_OSS = dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
               intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
               sliding_window=8, swiglu_limit=2.0,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
               rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0,
                                    original_max_position_embeddings=256, beta_fast=32.0,
                                    beta_slow=1.0, truncate=False))


def randomize_biases_and_sinks(path: str) -> None:
    from safetensors.torch import load_file, save_file
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    gen = torch.Generator().manual_seed(7)
    for name, t in tensors.items():
        if name.endswith(("bias", "sinks")):
            scale = 1.5 if name.endswith("sinks") else 0.3
            tensors[name] = torch.randn(t.shape, generator=gen) * scale
    save_file(tensors, file, metadata={"format": "pt"})


def save_tiny_gpt_oss(directory: str, **fields) -> str:
    path = save_tiny(directory, "GptOssConfig", **{**GPT_OSS, **fields})
    randomize_biases_and_sinks(path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_gpt_oss(str(tmp_path_factory.mktemp("gpt_oss")))


def test_prompt_logits_match_transformers(tiny):
    ids = prompt_ids(40)  # longer than the window
    ours = full_prompt_logits(get_model(make_vllm_config(tiny)), ids)
    torch.testing.assert_close(ours, hf_logits(tiny, ids), atol=1e-4, rtol=1e-4)


def test_greedy_and_logprobs_match_transformers(tiny):
    ids, results = run_engine(tiny)
    assert_matches_transformers(tiny, results, ids)


@pytest.mark.parametrize("native", [True, False], ids=["native-ops", "torch-ops"])
def test_chunked_prefill_with_sinks_and_windows(native, tiny, monkeypatch):
    """Prompts longer than the window prefilled in 16-token chunks: later chunks attend
    to the cached context with the sinks, through the window on sliding layers."""
    from tests.engine.conftest import PROMPTS
    from tests.models.test_breadth_hf import greedy_with_logprobs
    from vllm import LLM
    monkeypatch.setenv("VLLM_CPU_NATIVE_OPS", "1" if native else "0")
    llm = LLM(model=tiny, dtype="float32", max_model_len=512, kv_cache_memory_bytes=32 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=4)
    tok = llm.get_tokenizer()
    ids = [tok.encode(" ".join(PROMPTS[i:i + 3]))[:n] for i, n in ((0, 40), (3, 23), (5, 33))]
    results = greedy_with_logprobs(llm, ids)
    llm.llm_engine.shutdown()
    assert_matches_transformers(tiny, results, ids)


# ------------------------------------------------------------------------------ MXFP4
def _e2m1_value(code: torch.Tensor) -> torch.Tensor:
    """FP4 e2m1 decoded arithmetically (not the loader's table): sign, 2 exponent bits,
    1 mantissa bit; exponent 0 is subnormal (0 or 0.5)."""
    sign = 1.0 - 2.0 * ((code >> 3) & 1).double()
    exp, man = ((code >> 1) & 3).double(), (code & 1).double()
    mag = torch.where(exp == 0, man * 0.5, (1.0 + man * 0.5) * torch.pow(2.0, exp - 1))
    return sign * mag


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [..., rows, cols] (cols a multiple of 32) -> (blocks uint8 [..., rows, cols/32,
    16], scales uint8 [..., rows, cols/32], the dequantized float32 weight): per block
    of 32, the power of two that brings the largest |value| within 6, each value
    rounded to the nearest e2m1 code, two codes a byte (low nibble first)."""
    *lead, rows, cols = w.shape
    g = w.double().reshape(*lead, rows, cols // 32, 32)
    amax = g.abs().amax(-1).clamp_min(2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.pow(2.0, exp)[..., None]
    codes_all = torch.arange(16, dtype=torch.uint8)
    values = _e2m1_value(codes_all)
    codes = (scaled[..., None] - values).abs().argmin(-1).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exp + 127).to(torch.uint8)
    deq = (_e2m1_value(codes) * torch.pow(2.0, exp)[..., None]).reshape(*lead, rows, cols)
    return blocks, scales, deq.float()


def write_mxfp4_pair(src: str, mx_dir: str, deq_dir: str) -> None:
    """From the float checkpoint `src`: an MXFP4 checkpoint in the published layout
    (`<proj>_blocks` / `<proj>_scales` of the experts, [E, out, in] order, a config.json
    in the released style with quantization_config) and the float checkpoint holding the same weights
    dequantized."""
    import shutil
    from safetensors.torch import load_file, save_file
    for d in (mx_dir, deq_dir):
        shutil.copytree(src, d)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    mx, deq = {}, {}
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales, w = quantize_mxfp4(t.transpose(1, 2))  # [E, out, in]
            mx[f"{name}_blocks"], mx[f"{name}_scales"] = blocks, scales
            deq[name] = w.transpose(1, 2).contiguous()
        else:
            mx[name] = deq[name] = t
    save_file(mx, os.path.join(mx_dir, "model.safetensors"), metadata={"format": "pt"})
    save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_file = os.path.join(mx_dir, "config.json")
    cfg = json.load(open(cfg_file))
    # The released config.json's keys (written by transformers 4.55): rope_scaling and
    # rope_theta beside each other, the reference implementation's own names too.
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    cfg["experts_per_token"] = cfg["num_experts_per_tok"]
    cfg["initial_context_length"] = rope["original_max_position_embeddings"]
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    json.dump(cfg, open(cfg_file, "w"), indent=2)


def test_quantizer_round_trip_and_loader_dequantization():
    from vllm.model_executor.layers.quantization.mxfp4 import dequantize_mxfp4
    torch.manual_seed(0)
    w = torch.randn(3, 5, 64) * torch.logspace(-3, 2, 64)  # blocks of very different size
    blocks, scales, deq = quantize_mxfp4(w)
    assert blocks.shape == (3, 5, 2, 16) and scales.shape == (3, 5, 2)
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float32), deq)
    # FP4 keeps ~1 bit of mantissa: within a quarter of each block's largest value.
    amax = w.reshape(3, 5, 2, 32).abs().amax(-1, keepdim=True)
    assert ((deq - w).reshape(3, 5, 2, 32).abs() <= amax / 4 + 1e-12).all()
    with pytest.raises(ValueError, match="uint8"):
        dequantize_mxfp4(blocks.int(), scales)


def test_mxfp4_checkpoint_matches_the_dequantized_model(tiny, tmp_path):
    mx, deq = str(tmp_path / "mxfp4"), str(tmp_path / "dequantized")
    write_mxfp4_pair(tiny, mx, deq)
    config = make_vllm_config(mx)
    assert config.model_config.quant_config.name == "mxfp4"
    ids = prompt_ids(24)
    ours = full_prompt_logits(get_model(config), ids)
    torch.testing.assert_close(ours, full_prompt_logits(get_model(make_vllm_config(deq)),
                                                        ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, hf_logits(deq, ids), atol=1e-4, rtol=1e-4)
    # Not the float model's weights: the quantization is visible.
    assert (ours - hf_logits(tiny, ids)).abs().max() > 1e-3


@pytest.mark.timeout(300)
def test_tp2_and_expert_parallel_match_single_process(tiny, tmp_path):
    """TP=2 splits heads (and their sinks), the experts' intermediate size (gate/up
    biases sliced, the down bias on one rank); expert parallel gives each rank 2 whole
    experts."""
    from tests.models.test_parallel import _free_port
    ids = prompt_ids(24)
    expected = full_prompt_logits(get_model(make_vllm_config(tiny)), ids)
    cases = [("tp2-gpt-oss", tiny, False), ("ep2-gpt-oss", tiny, True)]
    mp.spawn(_tp_worker, args=(2, f"tcp://127.0.0.1:{_free_port()}",
                               [(n, p, ep, ids) for n, p, ep in cases], str(tmp_path)),
             nprocs=2, join=True)
    for name, _, ep in cases:
        for rank in range(2):
            r = torch.load(tmp_path / f"{name}-{rank}.pt")
            torch.testing.assert_close(r["logits"], expected, atol=1e-4, rtol=1e-4)
            assert r["local_experts"] == (2 if ep else 4), name
