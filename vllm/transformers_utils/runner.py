"""Which runner a model gets (generate or pooling) and its pooler's defaults.

Read once with the model's files (`load_model_config`): the architecture decides by
default (vLLM's `--runner auto`): encoders (`BertModel`, `XLMRobertaModel`) embed,
`*ForSequenceClassification` cross-encoders classify, `*ForCausalLM` decoders generate
unless `--runner pooling` / `--convert embed` makes them last-token embedders (as
Qwen3-Embedding). The pooling type comes from the model's sentence-transformers files
(`modules.json` -> `1_Pooling/config.json`), as sentence-transformers itself reads it.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

from vllm.config import ModelConfig

logger = logging.getLogger(__name__)

ENCODER_EMBED_ARCHS = {"BertModel": "CLS", "XLMRobertaModel": "CLS", "RobertaModel": "CLS"}
"""Encoder-only embedding architectures -> their default pooling (vLLM's)."""
CROSS_ENCODER_ARCHS = ("BertForSequenceClassification", "XLMRobertaForSequenceClassification",
                       "RobertaForSequenceClassification")
"""Encoder-only classifiers (rerankers): CLS pooling, the model's classifier head."""

_ST_POOLING_MODES = (("pooling_mode_cls_token", "CLS"), ("pooling_mode_mean_tokens", "MEAN"),
                     ("pooling_mode_lasttoken", "LAST"))


def resolve_runner(model_config: ModelConfig) -> None:
    """Set the runner, pooling task and pooler defaults on a loaded `model_config`."""
    archs = model_config.architectures
    runner, convert = model_config.runner, model_config.convert
    encoder_embed = next((a for a in archs if a in ENCODER_EMBED_ARCHS), None)
    cross_encoder = any(a in CROSS_ENCODER_ARCHS for a in archs)
    if encoder_embed or cross_encoder:
        if runner == "generate":
            raise ValueError(f"runner='generate': {archs} is an encoder-only pooling model; "
                             "use --runner pooling (or auto).")
        if convert == "embed" and cross_encoder:
            raise ValueError(f"convert='embed' does not apply to the classifier {archs}.")
        _cap_roberta_positions(model_config)
        task = "classify" if cross_encoder else "embed"
        defaults = {"pooling_type": sentence_transformers_pooling(model_config.model_path)
                    or ("CLS" if cross_encoder else ENCODER_EMBED_ARCHS[encoder_embed])}
        model_config.set_runner("pooling", task, True, defaults)
        return
    if runner == "pooling" or convert == "embed":
        if convert == "none":
            raise ValueError(f"runner='pooling' with convert='none': {archs} has no pooler; "
                             "use --convert embed for last-token embeddings.")
        defaults = {"pooling_type": sentence_transformers_pooling(model_config.model_path)
                    or "LAST"}
        model_config.set_runner("pooling", "embed", False, defaults)
        return
    model_config.set_runner("generate", None, False, None)


def _cap_roberta_positions(model_config: ModelConfig) -> None:
    """RoBERTa-style models number positions from padding_idx + 1, so the context is
    that much shorter than max_position_embeddings (514 -> 512 for XLM-R)."""
    cfg = model_config.hf_config
    if "roberta" not in str(getattr(cfg, "model_type", "")).lower():
        return
    usable = cfg.max_position_embeddings - (getattr(cfg, "pad_token_id", 1) or 0) - 1
    if model_config.max_model_len > usable:
        model_config.max_model_len = usable


def sentence_transformers_pooling(model_path: str) -> Optional[str]:
    """CLS / MEAN / LAST from the model's sentence-transformers pooling module, if any."""
    modules = _read_json(os.path.join(model_path, "modules.json"))
    if not isinstance(modules, list):
        return None
    for module in modules:
        if str(module.get("type", "")).endswith("Pooling"):
            config = _read_json(os.path.join(model_path, module.get("path", ""),
                                             "config.json"))
            for key, pooling in _ST_POOLING_MODES:
                if isinstance(config, dict) and config.get(key):
                    return pooling
    return None


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        logger.warning("Could not read %s: %s", path, e)
        return None
