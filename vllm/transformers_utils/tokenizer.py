"""Load the model's tokenizer (a transformers fast tokenizer), once per directory."""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Optional

logger = logging.getLogger(__name__)

_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def get_tokenizer(tokenizer_name: str, trust_remote_code: bool = False,
                  revision: Optional[str] = None, tokenizer_mode: str = "auto",
                  **kwargs: Any) -> Any:
    """The tokenizer in `tokenizer_name` (a local HF directory or a .gguf file).

    Results are cached per (path, options): the engine, the server and the
    detokenizer share one instance. `trust_remote_code` and `revision` are accepted
    for vLLM compatibility (the directory is already resolved; remote code is never
    run). `tokenizer_mode="slow"` loads the Python tokenizer instead of the fast one;
    `"mistral"` Mistral's tekken.json / tokenizer.model.v* through mistral-common
    (mistral_tokenizer.py).
    """
    if tokenizer_mode == "slow":
        kwargs["use_fast"] = False
    elif tokenizer_mode == "mistral":
        kwargs["mistral"] = True
    elif tokenizer_mode != "auto":
        raise ValueError(f"tokenizer_mode={tokenizer_mode!r} is not supported; choose 'auto', "
                         "'slow' or 'mistral'.")
    path = tokenizer_name
    if path.endswith(".gguf") and os.path.isfile(path):
        from vllm.transformers_utils.gguf_utils import ensure_converted
        path = ensure_converted(path)
    if not os.path.isdir(path):
        raise ValueError(f"tokenizer={tokenizer_name!r} is not a local directory or .gguf "
                         "file (this build has no model hub access).")
    key = (os.path.abspath(path), tuple(sorted(kwargs.items())))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load(path, kwargs)
        return _CACHE[key]


def _load(path: str, kwargs: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    if kwargs.pop("mistral", False):
        from vllm.transformers_utils.mistral_tokenizer import MistralTokenizer
        return MistralTokenizer(path)

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"Could not load a tokenizer from {path}: {e}") from e
    if kwargs.get("use_fast", True) is False and getattr(tokenizer, "is_fast", False):
        logger.warning("tokenizer_mode='slow': transformers has no slow tokenizer for %s; "
                       "using its fast tokenizer.", path)
    if not getattr(tokenizer, "is_fast", False) and kwargs.get("use_fast", True):
        logger.warning("Tokenizer in %s is not a fast tokenizer; detokenization will be slow.",
                       path)
    return tokenizer
