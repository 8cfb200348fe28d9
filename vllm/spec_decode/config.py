"""`SpeculativeConfig`: what `--speculative-config` / `LLM(speculative_config=...)` set.

Field names and defaults are vLLM's. Only values here: the draft model's own
`ModelConfig` is loaded by `EngineArgs` (it reads files) and attached as
`draft_model_config`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from vllm.utils.config_json import config_fields

logger = logging.getLogger(__name__)

NGRAM = "ngram"
DRAFT_MODEL = "draft_model"
METHODS = (NGRAM, DRAFT_MODEL)

MAX_SPECULATIVE_TOKENS = 16
"""A step verifies at most this many drafts per request (the HPU decode bucket's
query length grows with it; vLLM has no hard bound, but k beyond ~10 never pays)."""


@dataclass
class SpeculativeConfig:
    method: Optional[str] = None
    """ngram (prompt lookup) or draft_model; default: draft_model when `model` is set,
    else ngram."""
    num_speculative_tokens: int = 0
    """Draft tokens proposed per request and step (k); a step verifies k + 1 tokens."""
    model: Optional[str] = None
    """The draft model (a directory or .gguf sharing the target's tokenizer)."""
    prompt_lookup_min: Optional[int] = None
    """ngram: shortest suffix n-gram to look up (default: prompt_lookup_max, or 5)."""
    prompt_lookup_max: Optional[int] = None
    """ngram: longest suffix n-gram to look up (default: prompt_lookup_min, or 5)."""
    draft_tensor_parallel_size: Optional[int] = None
    """Tensor parallel size of the draft model (only 1: the draft runs whole on the
    driver rank, beside its shard of the target)."""
    quantization: Optional[str] = None
    """Quantization of the draft model's weights (as --quantization)."""
    revision: Optional[str] = None
    """Revision of the draft model (as --revision)."""
    max_model_len: Optional[int] = None
    """The draft model's context length; default: the smaller of its own and the
    target's. Requests longer than it are verified without drafts."""

    draft_model_config: Any = field(default=None, repr=False)
    """The draft's loaded ModelConfig (set by EngineArgs; None for ngram)."""

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = DRAFT_MODEL if self.model else NGRAM
        if self.method not in METHODS:
            raise ValueError(f"speculative_config.method={self.method!r} is not supported; "
                             f"choose one of {', '.join(METHODS)}.")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError("speculative_config.num_speculative_tokens must be an integer "
                             f"in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}.")
        if self.method == NGRAM:
            self._check_ngram()
        elif not self.model:
            raise ValueError("speculative_config.model: method draft_model needs the draft "
                             "model's path.")
        if self.draft_tensor_parallel_size not in (None, 1):
            raise ValueError("speculative_config.draft_tensor_parallel_size must be 1, got "
                             f"{self.draft_tensor_parallel_size}.")

    def _check_ngram(self) -> None:
        if self.model:
            raise ValueError("speculative_config.model: method ngram takes no draft model.")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = 5
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative_config.{name} must be an integer >= 1, got "
                                 f"{value!r}.")
        if lo > hi:
            raise ValueError(f"speculative_config.prompt_lookup_min ({lo}) must be <= "
                             f"prompt_lookup_max ({hi}).")
        self.prompt_lookup_min, self.prompt_lookup_max = lo, hi

    @property
    def use_draft_model(self) -> bool:
        return self.method == DRAFT_MODEL

    @classmethod
    def from_cli(cls, value: Any) -> Optional["SpeculativeConfig"]:
        """From the --speculative-config JSON text or a dict (None: no speculation)."""
        if value is None or isinstance(value, cls):
            return value
        value = config_fields(
            value, "speculative_config",
            (f.name for f in fields(cls) if f.init and f.name != "draft_model_config"),
            '{"method": "ngram", "num_speculative_tokens": 3}')
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config.num_speculative_tokens is required.")
        return cls(**value)

    def verify_with(self, vllm_config: Any) -> None:
        """Refuse what cannot run together with speculation yet (ValueError naming the
        field); called by VllmConfig once every part is built."""
        pc = vllm_config.parallel_config
        if pc.pipeline_parallel_size > 1:
            raise ValueError("speculative_config: speculative decoding is not supported "
                             "with pipeline_parallel_size > 1 yet.")
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            logger.warning("async_scheduling with speculative decoding: each step waits "
                           "for the previous step's accepted tokens (the drafts come from "
                           "them), so scheduling does not overlap the forward; the step "
                           "still runs on the executor's own thread.")
        if self.use_draft_model:
            self._verify_draft(vllm_config)

    def _verify_draft(self, vllm_config: Any) -> None:
        if vllm_config.device_config.device != "cpu" and \
                vllm_config.device_config.device != "cuda":
            raise ValueError("speculative_config.model: draft-model speculation runs on cpu "
                             "and cuda only (use method ngram on "
                             f"{vllm_config.device_config.device}).")
        draft = self.draft_model_config
        if draft is None:
            raise ValueError("speculative_config.model: the draft model config was not "
                             "loaded (build the engine config with EngineArgs).")
        target = vllm_config.model_config
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"speculative_config.model: the draft's vocabulary "
                             f"({draft.vocab_size}) differs from the target's "
                             f"({target.vocab_size}); they must share a tokenizer.")
