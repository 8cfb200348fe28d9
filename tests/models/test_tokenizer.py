"""get_tokenizer: one cached fast tokenizer per directory, clear errors otherwise."""
from __future__ import annotations

import pytest

from vllm.transformers_utils.tokenizer import get_tokenizer


def test_tokenizer_is_cached_and_fast(default_model_path):
    from vllm.transformers_utils.gguf_utils import ensure_converted
    model_dir = ensure_converted(default_model_path)
    tok = get_tokenizer(model_dir)
    assert tok.is_fast
    assert get_tokenizer(model_dir) is tok
    assert get_tokenizer(default_model_path) is tok  # a .gguf resolves to its conversion
    assert tok.decode(tok("Hello world")["input_ids"]) == "Hello world"
    assert tok.chat_template


def test_missing_tokenizer_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="not a local directory"):
        get_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="Could not load a tokenizer"):
        get_tokenizer(str(tmp_path))
