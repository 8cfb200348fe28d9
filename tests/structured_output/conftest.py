"""Fixtures for the structured output tests: the default model's tokenizer."""
from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.fixture(scope="session")
def default_tokenizer(default_model_path):
    """The SmolLM2 tokenizer (byte-level BPE with <|im_start|>/<|im_end|> specials)."""
    import transformers

    if importlib.util.find_spec("vllm.transformers_utils.gguf_utils") is not None:
        from vllm.config import DEFAULT_MODEL
        from vllm.transformers_utils.config import resolve_model_path
        return transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(default_model_path), gguf_file=os.path.basename(default_model_path))
