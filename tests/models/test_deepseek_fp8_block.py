"""DeepSeek's block-quantized FP8 checkpoints (`weight_block_size`, `weight_scale_inv`):
every projection and expert weight stored as fp8 in 16x16 blocks (partial blocks at the
edges) is dequantized on load; the engine's greedy tokens and top-5 logprobs equal
transformers' on the same dequantized weights saved as float."""
from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from tests.models._tiny_families import save_tiny
from tests.models.test_breadth_hf import assert_matches_transformers, run_engine
from tests.models.test_deepseek import CASES
from vllm.model_executor.layers.quantization.fp8_block import dequantize_block_fp8

BLOCK = (16, 16)


def _quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, scale_inv per block) with each block's max-abs at the fp8 max."""
    n, k = w.shape
    bn, bk = BLOCK
    scale = torch.empty(math.ceil(n / bn), math.ceil(k / bk))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            scale[i, j] = blk.abs().max().clamp(min=1e-12) / 448.0
    full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (w / full).clamp(-448, 448).to(torch.float8_e4m3fn), scale


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[str, str]:
    """(block-fp8 checkpoint, float checkpoint of the same dequantized weights)."""
    from safetensors.torch import load_file, save_file
    cls, fields = CASES["v3"]
    src = save_tiny(str(tmp_path_factory.mktemp("src")), cls, **fields)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    quant, ref = {}, {}
    for name, t in tensors.items():
        if t.dim() == 2 and name.endswith("proj.weight"):  # q/kv/o, MLPs and experts
            q, s = _quantize(t.float())
            quant[name], quant[name[:-len(".weight")] + ".weight_scale_inv"] = q, s
            ref[name] = dequantize_block_fp8(q, s, BLOCK)
        else:
            quant[name] = ref[name] = t
    dirs = []
    for kind, state in (("fp8", quant), ("ref", ref)):
        d = str(tmp_path_factory.mktemp(kind))
        for f in os.listdir(src):
            if f != "model.safetensors":
                shutil.copy(os.path.join(src, f), d)
        save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        dirs.append(d)
    cfg_file = os.path.join(dirs[0], "config.json")
    cfg = json.load(open(cfg_file))
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "fmt": "e4m3", "weight_block_size": list(BLOCK)}
    json.dump(cfg, open(cfg_file, "w"))
    return dirs[0], dirs[1]


def test_block_fp8_checkpoint_matches_dequantized_reference(checkpoints):
    fp8, ref = checkpoints
    ids, results = run_engine(fp8)
    assert_matches_transformers(ref, results, ids)


def test_dequantize_handles_partial_blocks():
    w = torch.randn(40, 24)
    q, s = _quantize(w)
    assert s.shape == (3, 2)
    out = dequantize_block_fp8(q, s, BLOCK)
    torch.testing.assert_close(out, w, atol=0.1, rtol=0.07)  # fp8's 3-bit mantissa
    with pytest.raises(ValueError, match="weight_scale_inv"):
        dequantize_block_fp8(q, s[:2], BLOCK)


def test_fake_hpu_keeps_linear_weights_in_fp8(checkpoints):
    """On Gaudi the linear layers hold fp8 weights (per output channel, from the
    dequantized blocks) for the shim's fp8 GEMM; MLA's absorbed kv_b_proj and the router
    stay float. The logits stay within fp8's error of the float model's (the CPU's own
    online per-channel fp8 of the same float model is ~17% off here too: 2 layers of
    x4-scaled random weights with fp8 activations)."""
    from tests.hpu.conftest import platform_env
    from tests.models._model_helpers import full_prompt_logits, make_vllm_config, prompt_ids
    from vllm.model_executor.model_loader import get_model
    fp8, ref = checkpoints
    ids = prompt_ids(40)
    with platform_env("cpu"):
        expected = full_prompt_logits(get_model(make_vllm_config(ref)), ids)
    with platform_env("hpu"):
        model = get_model(make_vllm_config(fp8))
        got = full_prompt_logits(model, ids)
    attn = model.model.layers[1].self_attn
    assert attn.q_b_proj.weight.dtype == torch.float8_e4m3fn
    assert attn.o_proj.weight.dtype == torch.float8_e4m3fn
    assert attn.kv_b_proj.weight.dtype == torch.float32
    assert model.model.layers[1].mlp.gate.weight.dtype == torch.float32
    assert ((got - expected).norm() / expected.norm()).item() < 0.3
