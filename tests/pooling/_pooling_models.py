"""Tiny random-weight pooling models saved the way their Hugging Face classes save them,
with a real WordPiece tokenizer built from a small vocabulary (no hub access)."""
from __future__ import annotations

import json
import os
import string

WORDS = ("the a an is was of to in and for on with what where who how paris france "
         "capital city berlin germany river cat dog sat mat sun hot cold water fish "
         "swims sky blue green red book read machine learning model vector search "
         "query document rank score").split()


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                 "{% endfor %}")
"""A minimal chat template, so chat-form embedding requests can be rendered."""


def write_bert_tokenizer(directory: str) -> int:
    """A BertTokenizerFast over WORDS + characters (+ ## pieces); returns the vocab size."""
    from transformers import BertTokenizerFast
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = specials + WORDS + chars + ["##" + c for c in string.ascii_lowercase]
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=path, do_lower_case=True, model_max_length=128)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(directory)
    return len(vocab)


def _encoder_config(kind: str, vocab_size: int, **overrides):
    import transformers
    base = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=128, max_position_embeddings=130,
                hidden_act="gelu")
    base.update(overrides)
    if kind.startswith("xlmr"):
        return transformers.XLMRobertaConfig(pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                             type_vocab_size=1, **base)
    return transformers.BertConfig(pad_token_id=0, type_vocab_size=2, **base)


def make_tiny_encoder(directory: str, kind: str, pooling: str | None = None,
                      **overrides) -> str:
    """kind: bert | bert-cls (cross-encoder, 1 label) | xlmr | xlmr-cls.

    `pooling` (CLS / MEAN) writes sentence-transformers' modules.json + 1_Pooling."""
    import torch
    import transformers
    vocab_size = write_bert_tokenizer(directory)
    config = _encoder_config(kind, vocab_size, **overrides)
    torch.manual_seed(0)
    if kind.endswith("-cls"):
        config.num_labels = overrides.get("num_labels", 1)
        cls = (transformers.XLMRobertaForSequenceClassification if kind.startswith("xlmr")
               else transformers.BertForSequenceClassification)
    else:
        cls = transformers.XLMRobertaModel if kind.startswith("xlmr") else transformers.BertModel
    model = cls(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    if pooling is not None:
        write_sentence_transformers_pooling(directory, pooling, config.hidden_size)
    return directory


def write_sentence_transformers_pooling(directory: str, pooling: str, dim: int) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
    with open(os.path.join(directory, "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(directory, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": dim,
                   "pooling_mode_cls_token": pooling == "CLS",
                   "pooling_mode_mean_tokens": pooling == "MEAN",
                   "pooling_mode_lasttoken": pooling == "LAST"}, f)
