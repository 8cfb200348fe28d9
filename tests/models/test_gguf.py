"""GGUF -> HF directory conversion: same tensors, config and tokenizer as transformers."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from vllm.transformers_utils import gguf_utils
from vllm.transformers_utils.gguf_utils import ensure_converted


@pytest.fixture(scope="module")
def conversion(default_model_path, tmp_path_factory):
    """A fresh conversion into an empty cache root, then a second (cached) call."""
    root = tmp_path_factory.mktemp("vllm-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CACHE_ROOT", str(root))
        out = ensure_converted(default_model_path)
        start = time.perf_counter()
        again = ensure_converted(default_model_path)
        second_s = time.perf_counter() - start
    return {"out": out, "again": again, "second_s": second_s, "root": str(root)}


@pytest.fixture(scope="module")
def hf_gguf_model(default_model_path):
    """What transformers itself loads from the GGUF file (weights and config)."""
    import transformers

    folder, name = os.path.split(default_model_path)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                             dtype=torch.float32)


def test_second_call_reuses_the_cache(conversion):
    assert conversion["again"] == conversion["out"]
    assert conversion["second_s"] < 0.2
    assert conversion["out"].startswith(os.path.join(conversion["root"], "gguf") + os.sep)
    # Only the finished directory is left (no temporary siblings).
    assert os.listdir(os.path.dirname(conversion["out"])) == [
        os.path.basename(conversion["out"])]
    files = set(os.listdir(conversion["out"]))
    assert {"config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json"} <= files


def test_tensors_equal_transformers_gguf_load(conversion, hf_gguf_model):
    from safetensors.torch import load_file

    ref = hf_gguf_model.state_dict()
    ours = load_file(os.path.join(conversion["out"], "model.safetensors"))
    # SmolLM2 ties the LM head to the embedding: the file holds no lm_head.
    assert set(ours) == set(ref) - {"lm_head.weight"}
    for key, value in ours.items():
        assert value.dtype == torch.float32, key
        assert torch.equal(value, ref[key]), key
    assert torch.equal(ref["lm_head.weight"], ours["model.embed_tokens.weight"])


def test_config_matches_transformers(conversion, hf_gguf_model):
    import transformers

    ref = hf_gguf_model.config
    ours = transformers.AutoConfig.from_pretrained(conversion["out"])
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "max_position_embeddings", "vocab_size", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "rope_parameters"):
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.architectures == ["LlamaForCausalLM"]
    assert ours.dtype == torch.float32
    with open(os.path.join(conversion["out"], "generation_config.json")) as f:
        assert json.load(f) == {"bos_token_id": ref.bos_token_id, "eos_token_id": ref.eos_token_id}


def test_tokenizer_matches_transformers(conversion, default_model_path):
    import transformers

    folder, name = os.path.split(default_model_path)
    ref = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ours = transformers.AutoTokenizer.from_pretrained(conversion["out"])
    text = "Hello, world! Ünïcödé  spaces\n\ttabs 12345"
    assert ours(text)["input_ids"] == ref(text)["input_ids"]
    messages = [{"role": "user", "content": "Hi"}]
    assert ours.chat_template and ours.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True) == ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert (ours.eos_token_id, ours.bos_token_id) == (ref.eos_token_id, ref.bos_token_id)


def test_concurrent_converter_keeps_the_first_copy(tmp_path, monkeypatch):
    """If another process renamed its copy into place first, ours is discarded."""
    fake = tmp_path / "tiny.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    out = gguf_utils.converted_dir(str(fake))

    def convert_while_other_process_wins(path, tmp_dir):
        os.makedirs(out)
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write('{"winner": "other"}')
        with open(os.path.join(tmp_dir, "config.json"), "w") as f:
            f.write('{"winner": "us"}')

    monkeypatch.setattr(gguf_utils, "convert_gguf", convert_while_other_process_wins)
    assert ensure_converted(str(fake)) == out
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f) == {"winner": "other"}
    assert os.listdir(os.path.dirname(out)) == [os.path.basename(out)]


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "broken.gguf"
    fake.write_bytes(b"not a gguf file")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    with pytest.raises(Exception):
        ensure_converted(str(fake))
    assert os.listdir(tmp_path / "cache" / "gguf") == []


def test_cache_key_follows_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"a")
    first = gguf_utils.converted_dir(str(fake))
    fake.write_bytes(b"ab")
    assert gguf_utils.converted_dir(str(fake)) != first


def test_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ensure_converted(str(tmp_path / "nope.gguf"))
