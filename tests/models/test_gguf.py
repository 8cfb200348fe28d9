"""GGUF -> HF directory conversion: same tensors, config and tokenizer as transformers."""
from __future__ import annotations

import json
import os

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
        conversions = []
        mp.setattr(gguf_utils, "convert_gguf", lambda *a: conversions.append(a))
        again = ensure_converted(default_model_path)
    return {"out": out, "again": again, "converted_again": bool(conversions),
            "root": str(root)}


@pytest.fixture(scope="module")
def hf_gguf_model(default_model_path):
    """What transformers itself loads from the GGUF file (weights and config)."""
    import transformers

    folder, name = os.path.split(default_model_path)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                             dtype=torch.float32)


def test_second_call_reuses_the_cache(conversion):
    assert conversion["again"] == conversion["out"]
    assert not conversion["converted_again"]  # (how fast: benchmarks, not tests)
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


def test_tokenizer_matches_the_gguf_vocabulary(conversion, default_model_path):
    import gguf
    import transformers

    reader = gguf.GGUFReader(default_model_path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    template = reader.fields["tokenizer.chat_template"].contents()
    ours = transformers.AutoTokenizer.from_pretrained(conversion["out"])
    assert ours.convert_ids_to_tokens(list(range(len(tokens)))) == tokens
    assert ours.chat_template == template
    assert ours.bos_token_id == reader.fields["tokenizer.ggml.bos_token_id"].contents()
    assert ours.eos_token_id == reader.fields["tokenizer.ggml.eos_token_id"].contents()
    text = "Hello, world!  Two spaces\n\ttab 12345"
    ids = ours(text)["input_ids"]
    assert ours.decode(ids) == text and len(ids) < len(text) // 2


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


_HF_TO_GGUF = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    base, suffix = hf_name.rsplit(".", 1)
    if base in _HF_TO_GGUF:
        return f"{_HF_TO_GGUF[base]}.{suffix}"
    _, _, layer, module = base.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF[module]}.{suffix}"


def _llama_cpp_permute(w, n_head: int):
    """The row order llama.cpp's converter gives q/k weights of llama models."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def _write_gguf(src: str, arch: str, path: str) -> None:
    """A float32 GGUF of a tiny HF model, laid out as llama.cpp's converter does."""
    import gguf
    import transformers

    from vllm.model_executor.model_loader import iterate_weights

    cfg = transformers.AutoConfig.from_pretrained(src)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    if getattr(cfg, "head_dim", None):
        writer.add_key_length(cfg.head_dim)
    for name, tensor in iterate_weights(src):
        w = tensor.numpy()
        if arch == "llama" and ".q_proj." in name:
            w = _llama_cpp_permute(w, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            w = _llama_cpp_permute(w, cfg.num_key_value_heads)
        writer.add_tensor(_gguf_name(name), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_round_trip_through_llama_cpp_layout(arch, tiny_model_factory, tmp_path, monkeypatch):
    """HF model -> GGUF (q/k permuted for llama) -> our conversion == the original."""
    import transformers

    from vllm.model_executor.model_loader import iterate_weights

    src = tiny_model_factory(arch)
    path = str(tmp_path / f"tiny-{arch}.gguf")
    _write_gguf(src, arch, path)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    # The tiny file carries no vocabulary; tokenizer export is covered by SmolLM2 above.
    monkeypatch.setattr(gguf_utils, "_export_tokenizer", lambda gguf_path, out_dir: None)
    out = ensure_converted(path)

    original = dict(iterate_weights(src))
    converted = dict(iterate_weights(out))
    assert set(converted) == set(original)
    for name, value in original.items():
        assert torch.equal(converted[name], value), name
    ref = transformers.AutoConfig.from_pretrained(src)
    ours = transformers.AutoConfig.from_pretrained(out)
    assert ours.architectures == ref.architectures
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(ours, key) == getattr(ref, key), key
    assert getattr(ours, "head_dim", None) in (getattr(ref, "head_dim", None),
                                               ref.hidden_size // ref.num_attention_heads)
    assert ours.rms_norm_eps == pytest.approx(ref.rms_norm_eps)
    assert ours.rope_parameters["rope_theta"] == ref.rope_parameters["rope_theta"]
