"""Bad quantization settings fail at start, naming the field; nothing is loaded."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.quantization._ckpt import float_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return float_dir(str(tmp_path_factory.mktemp("qcfg")))


def _with_qcfg(src: str, dst: str, qcfg: dict) -> str:
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = qcfg
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}}}}


def _bad(qcfg_patch):
    cfg = json.loads(json.dumps(CT_FP8))
    qcfg_patch(cfg)
    return cfg


@pytest.mark.parametrize("qcfg, field", [
    ({"quant_method": "fancy4"}, "quant_method"),
    ({"bits": 4}, "quant_method"),
    (_bad(lambda c: c["config_groups"]["group_0"]["weights"].update(num_bits=6)), "num_bits"),
    (_bad(lambda c: c["config_groups"]["group_0"]["weights"].update(strategy="block")),
     "strategy"),
    (_bad(lambda c: c.update(sparsity_config={"format": "2:4"})), "sparsity_config"),
    ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "activation_scheme"),
    # Block-wise scales are read (fp8_block.py); a malformed block size is refused.
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
])
def test_bad_quantization_config_names_field(tiny, tmp_path, qcfg, field):
    from vllm.transformers_utils.config import create_model_config
    path = _with_qcfg(tiny, str(tmp_path / "bad"), qcfg)
    with pytest.raises(ValueError, match=field):
        create_model_config(model=path, dtype="float32")


def test_flag_must_match_checkpoint(tiny, tmp_path):
    from vllm.transformers_utils.config import create_model_config
    path = _with_qcfg(tiny, str(tmp_path / "ct"), CT_FP8)
    with pytest.raises(ValueError, match="does not match"):
        create_model_config(model=path, dtype="float32", quantization="fp8")
    with pytest.raises(ValueError, match="quantization='int3'"):
        create_model_config(model=tiny, dtype="float32", quantization="int3")


def test_unquantized_model_keeps_packed_bf16_path(tiny):
    """No quantization: plain weights, the packed bf16 GEMM of the runner applies."""
    from tests.models._model_helpers import make_vllm_config
    from vllm.cpu.gemm import pack_linear_weights
    from vllm.model_executor.layers.quantization.unquantized import UnquantizedLinearMethod
    from vllm.model_executor.model_loader import get_model
    model = get_model(make_vllm_config(tiny, dtype="bfloat16"))
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant_method, UnquantizedLinearMethod)
    assert pack_linear_weights(model) == 4 * 2 + 1  # both decoder layers, and the LM head
