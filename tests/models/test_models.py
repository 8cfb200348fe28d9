"""Our models against transformers on the same weights: full-prompt logits."""
from __future__ import annotations

import pytest
import torch

from _model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from vllm.model_executor.model_loader import get_model, iterate_weights

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


@pytest.fixture(scope="module")
def smollm2_dir():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    return resolve_model_path(DEFAULT_MODEL)


def test_smollm2_matches_transformers(smollm2_dir):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    ids = torch.tensor(tok("The capital of France is Paris. The capital of Germany is")
                       ["input_ids"])
    model = get_model(make_vllm_config(smollm2_dir))
    ours = full_prompt_logits(model, ids)
    ref = hf_logits(smollm2_dir, ids)
    assert ours.shape == (len(ids), 49152)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    assert tok.decode(ours[-1].argmax()).strip() == "Berlin"


def with_rope(path: str, rope: dict, tmp_path) -> str:
    """A copy of a tiny model whose config asks for rope scaling (weights unchanged)."""
    import json
    import shutil

    out = tmp_path / "rope-scaled"
    shutil.copytree(path, out)
    config = json.loads((out / "config.json").read_text())
    config["rope_parameters"] = {**rope, "rope_theta": config["rope_parameters"]["rope_theta"]}
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


@pytest.mark.parametrize("arch,overrides,rope", [
    ("mistral", {}, None),
    ("qwen2", {}, None),
    ("qwen3", {}, None),
    ("llama", {"attention_bias": True}, LLAMA3_ROPE),
    ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4},
     {"rope_type": "linear", "factor": 2.0}),
    ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 1}, None),
], ids=["mistral", "qwen2", "qwen3", "llama3-rope-bias", "llama-linear-tied", "qwen2-tied-mqa"])
def test_tiny_models_match_transformers(tiny_model_factory, tmp_path, arch, overrides, rope):
    path = tiny_model_factory(arch, **overrides)
    if rope:
        path = with_rope(path, rope, tmp_path)
    ids = prompt_ids(96)  # past original_max_position_embeddings of the llama3 case
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)


def test_bfloat16_model_stays_close_to_transformers(tiny_model_factory):
    path = tiny_model_factory("qwen3")
    ids = prompt_ids(32)
    model = get_model(make_vllm_config(path, dtype="bfloat16"))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ours = full_prompt_logits(model, ids).float()
    ref = hf_logits(path, ids, dtype=torch.bfloat16).float()
    assert (ours - ref).abs().max() < 0.05 * ref.abs().max()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_model_is_ready_for_inference(tiny_model_factory):
    model = get_model(make_vllm_config(tiny_model_factory("qwen2")))
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert (model.start_layer, model.end_layer) == (0, 2)
    attn_layers = [m.attn.layer_idx for m in model.modules() if hasattr(m, "attn")]
    assert attn_layers == [0, 1]


def test_dummy_load_format_skips_the_checkpoint(tiny_model_factory):
    model = get_model(make_vllm_config(tiny_model_factory("qwen2"), load_format="dummy"))
    weight = model.model.layers[0].mlp.down_proj.weight
    assert weight.abs().max() <= 1e-3 and weight.abs().max() > 0
    logits = full_prompt_logits(model, prompt_ids(8))
    assert torch.isfinite(logits).all()


def test_sharded_safetensors_and_pytorch_bin(tiny_model_factory, tmp_path):
    """The same weights from an index + shards, or from pytorch_model.bin, load identically."""
    import json
    import shutil

    from safetensors.torch import save_file

    src = tiny_model_factory("qwen2")
    tensors = dict(iterate_weights(src))
    names = sorted(tensors)
    for kind in ("sharded", "bin"):
        d = tmp_path / kind
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors"))
        if kind == "sharded":
            halves = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
                      "model-00002-of-00002.safetensors": names[len(names) // 2:]}
            for file, keys in halves.items():
                save_file({k: tensors[k] for k in keys}, str(d / file))
            index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
            (d / "model.safetensors.index.json").write_text(json.dumps(index))
        else:
            torch.save(tensors, d / "pytorch_model.bin")
        loaded = dict(iterate_weights(str(d)))
        assert sorted(loaded) == names
        ids = prompt_ids(16)
        torch.testing.assert_close(full_prompt_logits(get_model(make_vllm_config(str(d))), ids),
                                   full_prompt_logits(get_model(make_vllm_config(src)), ids),
                                   atol=0, rtol=0)


def test_missing_weights_are_reported(tiny_model_factory):
    model_cfg = make_vllm_config(tiny_model_factory("qwen2"), load_format="dummy")
    model = get_model(model_cfg)
    weights = [(n, t) for n, t in iterate_weights(model_cfg.model_config.model_path)
               if "layers.1.mlp.down_proj" not in n]
    with pytest.raises(ValueError, match="layers.1.mlp.down_proj.weight"):
        model.load_weights(weights)


def test_unknown_architecture_lists_supported_ones():
    from vllm.model_executor.models.registry import ModelRegistry
    with pytest.raises(ValueError) as err:
        ModelRegistry.resolve_model_cls(["GPTBigCodeForCausalLM"])
    message = str(err.value)
    assert "GPTBigCodeForCausalLM" in message
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM"):
        assert arch in message
    cls, arch = ModelRegistry.resolve_model_cls(["Foo", "MistralForCausalLM"])
    assert (cls.__name__, arch) == ("LlamaForCausalLM", "MistralForCausalLM")
