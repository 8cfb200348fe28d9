"""Where a model comes from: a local directory, or a Hugging Face Hub id resolved to a
snapshot in the HF cache through `huggingface_hub` (downloaded when the Hub can be
reached; from the cache alone with HF_HUB_OFFLINE=1, which huggingface_hub reads).

Also: refusing configs that need custom code we do not have, and `hf_overrides`.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

logger = logging.getLogger(__name__)

# Files a model needs: config, weights, tokenizer, generation defaults, chat template.
_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken",
                   "*.jinja", "*.py"]


def looks_like_repo_id(model: str) -> bool:
    """'org/name' or 'name' (no path separators beyond one '/', no file suffix)."""
    parts = model.split("/")
    return (0 < len(parts) <= 2 and all(parts) and not model.startswith((".", "~"))
            and not model.endswith(".gguf"))


DEFAULT_IGNORE_PATTERNS = ["original/**/*"]
"""vLLM's default --ignore-patterns: the consolidated copies some repos ship beside the
HF checkpoint."""


def resolve_hub_model(repo_id: str, revision: Optional[str] = None,
                      download_dir: Optional[str] = None, token: Optional[str | bool] = None,
                      ignore_patterns: Optional[list[str]] = None) -> str:
    """Local snapshot directory of `repo_id` at `revision` (a branch, tag or commit),
    in `download_dir` or the default HF cache. ValueError when it cannot be had.
    `token`: --hf-token; `ignore_patterns`: --ignore-patterns (files not downloaded)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError
    if ignore_patterns is None:
        ignore_patterns = DEFAULT_IGNORE_PATTERNS
    try:
        path = snapshot_download(repo_id=repo_id, revision=revision, cache_dir=download_dir,
                                 allow_patterns=_ALLOW_PATTERNS, token=token,
                                 ignore_patterns=ignore_patterns or None)
    except HFValidationError as e:
        raise ValueError(f"model={repo_id!r} is neither a local path nor a valid Hugging "
                         f"Face model id: {e}") from e
    except Exception as e:  # noqa: BLE001 - offline, unknown repo/revision, network
        where = download_dir or "the Hugging Face cache"
        raise ValueError(
            f"model={repo_id!r} (revision {revision or 'main'}) is not a local path and could "
            f"not be resolved on the Hugging Face Hub or found in {where}: "
            f"{type(e).__name__}: {e}") from e
    logger.info("Resolved %s (revision %s) to %s", repo_id, revision or "main", path)
    return path


def check_remote_code(model_path: str, trust_remote_code: bool) -> None:
    """Refuse a config whose architecture exists only as custom code in the repository.

    Such configs carry `auto_map`. If transformers knows the `model_type` and this engine
    implements one of the `architectures`, the custom code is not needed and is ignored.
    Otherwise the model cannot run here: remote code is never executed, with or without
    --trust-remote-code.
    """
    config_file = os.path.join(model_path, "config.json")
    if not os.path.isfile(config_file):
        return
    with open(config_file) as f:
        raw = json.load(f)
    auto_map = raw.get("auto_map")
    if not auto_map:
        return
    from transformers import CONFIG_MAPPING

    from vllm.model_executor.models.registry import ModelRegistry
    archs = list(raw.get("architectures") or [])
    supported = set(ModelRegistry.get_supported_archs())
    if raw.get("model_type") in CONFIG_MAPPING and any(a in supported for a in archs):
        logger.info("%s ships custom code (auto_map); using the built-in %s instead.",
                    model_path, next(a for a in archs if a in supported))
        return
    hint = ("remote code is never executed by this engine, so --trust-remote-code cannot "
            "help" if trust_remote_code else "--trust-remote-code would not help either: "
            "remote code is never executed by this engine")
    raise ValueError(
        f"The model in {model_path} needs custom code from its repository (auto_map: "
        f"{', '.join(f'{k} -> {v}' for k, v in auto_map.items())}) for model_type "
        f"{raw.get('model_type')!r} / architectures {archs}, which vLLM-HPU does not "
        f"implement; {hint}. Supported architectures: {', '.join(sorted(supported))}.")


def apply_hf_overrides(config: Any, overrides: Optional[dict]) -> None:
    """Set config attributes from `overrides` (vLLM's --hf-overrides); a dict value
    for a nested config (e.g. `text_config`) updates that config's attributes."""
    for key, value in (overrides or {}).items():
        current = getattr(config, key, None)
        if isinstance(value, dict) and hasattr(current, "to_dict"):
            apply_hf_overrides(current, value)
        else:
            setattr(config, key, value)
