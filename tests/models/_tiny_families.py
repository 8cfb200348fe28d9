"""Tiny random-weight checkpoints of the families of tests/models/test_new_families.py
and test_deepseek.py: saved by transformers (or, for InternLM2, which transformers does
not ship, written from a Llama checkpoint), with the default model's tokenizer."""
from __future__ import annotations

import json
import os

import torch

BASE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=1024, bos_token_id=1,
            eos_token_id=2)


def _save_tokenizer(directory: str) -> None:
    import transformers
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.save_pretrained(directory)


def save_tiny(directory: str, config_cls: str, scale: float = 4.0, **fields) -> str:
    """A `config_cls` (transformers name) model with BASE + `fields`, weights of 2+
    dimensions scaled by `scale` (random init of this size gives near-uniform logits;
    wider ones make greedy decisive), saved with safetensors."""
    import transformers
    config = getattr(transformers, config_cls)(**{**BASE, **fields})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def internlm2_from_llama(llama_dir: str, directory: str, bias: bool = False) -> str:
    """The InternLM2 checkpoint equivalent to the Llama one in `llama_dir`: q/k/v packed
    into `wqkv` per KV group (`[kv_heads, groups + 2, head_dim, hidden]`), InternLM2's
    tensor names and config (model_type "internlm2", with the `auto_map` the real
    repositories carry). The Llama model in `llama_dir` is the reference."""
    from safetensors.torch import load_file, save_file
    cfg = json.load(open(os.path.join(llama_dir, "config.json")))
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // heads
    src = load_file(os.path.join(llama_dir, "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    renames = {"model.embed_tokens.": "model.tok_embeddings.", "lm_head.": "output.",
               ".self_attn.o_proj.": ".attention.wo.", ".mlp.gate_proj.": ".feed_forward.w1.",
               ".mlp.up_proj.": ".feed_forward.w3.", ".mlp.down_proj.": ".feed_forward.w2.",
               ".input_layernorm.": ".attention_norm.",
               ".post_attention_layernorm.": ".ffn_norm."}
    for name, t in src.items():
        if ".self_attn.q_proj." in name:
            kind = name.rsplit(".", 1)[1]  # weight / bias
            k = src[name.replace("q_proj", "k_proj")]
            v = src[name.replace("q_proj", "v_proj")]
            tail = t.shape[1:]
            packed = torch.cat([t.reshape(kv, heads // kv, head_dim, *tail),
                                k.reshape(kv, 1, head_dim, *tail),
                                v.reshape(kv, 1, head_dim, *tail)], dim=1)
            out[name.replace(f"self_attn.q_proj.{kind}", f"attention.wqkv.{kind}")] = \
                packed.reshape(-1, *tail).contiguous()
            continue
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        for old, new in renames.items():
            if old in name:
                name = name.replace(old, new)
                break
        out[name] = t.contiguous()
    os.makedirs(directory, exist_ok=True)
    save_file(out, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    config = dict(architectures=["InternLM2ForCausalLM"], model_type="internlm2",
                  auto_map={"AutoConfig": "configuration_internlm2.InternLM2Config",
                            "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
                  vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                  intermediate_size=cfg["intermediate_size"],
                  num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
                  num_key_value_heads=kv, hidden_act="silu",
                  max_position_embeddings=cfg["max_position_embeddings"],
                  rms_norm_eps=cfg["rms_norm_eps"], bias=bias, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                  torch_dtype="float32")
    json.dump(config, open(os.path.join(directory, "config.json"), "w"))
    _save_tokenizer(directory)
    return directory
