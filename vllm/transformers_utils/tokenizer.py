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
                  revision: Optional[str] = None, **kwargs: Any) -> Any:
    """The tokenizer in `tokenizer_name` (a local HF directory or a .gguf file).

    Results are cached per (path, options): the engine, the server and the
    detokenizer share one instance. `trust_remote_code` and `revision` are accepted
    for vLLM compatibility; models are local and remote code is never run.
    """
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

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"Could not load a tokenizer from {path}: {e}") from e
    if not getattr(tokenizer, "is_fast", False):
        logger.warning("Tokenizer in %s is not a fast tokenizer; detokenization will be slow.",
                       path)
    return tokenizer
