"""Sampling parameters for text generation, with vLLM's fields, defaults and checks.

Every range check happens in `__post_init__` so a bad request fails when it is built
(offline `LLM.generate` and the OpenAI server alike), with a `ValueError` that names
the field and the allowed range. Checks that need the model (vocabulary size,
`max_logprobs`) live in `verify_against`, called by the input processor.
"""
from __future__ import annotations

import copy
import enum
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-5
"""Temperatures below this mean greedy decoding."""
_MIN_TEMP = 1e-2
"""Smallest non-greedy temperature: lower ones overflow float32 logits / temperature."""
_MAX_LOGIT_BIAS = 100.0
"""OpenAI's clamp for logit_bias values."""


@dataclass
class StructuredOutputsParams:
    """Constrain a request's output to a JSON schema, a regex, a choice or a grammar.

    Exactly one of `json`, `regex`, `choice`, `grammar`, `json_object` (and
    `structural_tag`) must be set. The grammar is compiled
    off the engine loop by the backend of `--structured-outputs-config` (xgrammar by
    default, llguidance second) and applied as a token bitmask on the logits.
    """
    json: Optional[Union[str, dict]] = None
    """A JSON schema (dict or JSON text) the output must validate against."""
    regex: Optional[str] = None
    """A regular expression the whole output must match."""
    choice: Optional[list[str]] = None
    """The output is exactly one of these strings."""
    grammar: Optional[str] = None
    """A context-free grammar: GBNF/EBNF (`root ::= ...`) or Lark (`start: ...`)."""
    json_object: Optional[bool] = None
    """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
    structural_tag: Optional[str] = None
    """Free text in which each trigger starts one of the structures (JSON text:
    `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`, vLLM's form, or
    xgrammar's `{"type": "structural_tag", "format": {...}}`; the xgrammar backend).
    Strict tools with tool_choice "auto" are held to their schemas this way."""
    disable_any_whitespace: bool = False
    """Compact JSON: no optional whitespace between tokens of the JSON output."""
    disable_additional_properties: bool = False
    """Objects of the schema take no properties beyond those listed."""
    whitespace_pattern: Optional[str] = None
    """A regex for the optional whitespace between JSON tokens (json / json_object; the
    guidance backend). By default runs of whitespace are bounded (MAX_WHITESPACE)."""

    def __post_init__(self) -> None:
        given = [name for name in _STRUCTURED_KINDS if _is_set(getattr(self, name))]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs: exactly one of "
                f"{', '.join(_STRUCTURED_KINDS)} must be set, got "
                f"{', '.join(given) if given else 'none'}.")
        if self.structural_tag is not None:
            _check_structural_tag(self.structural_tag)
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError("structured_outputs.json must be a JSON schema (an object or its "
                             f"JSON text), got {type(self.json).__name__}.")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string.")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) for c in self.choice)):
                raise ValueError("structured_outputs.choice must be a non-empty list of "
                                 "strings.")
            self.choice = list(self.choice)
        if self.json_object is not None and self.json_object is not True:
            raise ValueError("structured_outputs.json_object must be true when given.")
        if self.whitespace_pattern is not None:
            if not isinstance(self.whitespace_pattern, str) or not self.whitespace_pattern:
                raise ValueError("structured_outputs.whitespace_pattern must be a non-empty "
                                 "regex string.")
            if self.kind not in ("json", "json_object"):
                raise ValueError("structured_outputs.whitespace_pattern applies to json and "
                                 f"json_object constraints, not {self.kind}.")

    @property
    def kind(self) -> str:
        """Which constraint is set: json, regex, choice, grammar or json_object."""
        return next(name for name in _STRUCTURED_KINDS if _is_set(getattr(self, name)))


_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _check_structural_tag(value: Any) -> None:
    import json
    try:
        tag = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as e:
        raise ValueError(f"structured_outputs.structural_tag is not valid JSON: {e}") from None
    if isinstance(tag, dict) and tag.get("type") == "structural_tag":
        if not isinstance(tag.get("format"), dict):
            raise ValueError('structured_outputs.structural_tag {"type": "structural_tag"} '
                             'needs a "format" object (xgrammar\'s structural tag form).')
        return  # xgrammar's own form: its compile checks the rest
    if not (isinstance(tag, dict) and isinstance(tag.get("structures"), list)
            and isinstance(tag.get("triggers"), list) and all(
                isinstance(s, dict) and {"begin", "schema", "end"} <= set(s)
                for s in tag["structures"])):
        raise ValueError('structured_outputs.structural_tag must be JSON text of '
                         '{"structures": [{"begin", "schema", "end"}, ...], '
                         '"triggers": [...]} or {"type": "structural_tag", "format": {...}}.')


def _is_set(value: Any) -> bool:
    return value is not None and value is not False


class LogprobsTooLargeError(ValueError):
    """logprobs or prompt_logprobs above --max-logprobs (`name`, `value`, `cap`)."""

    def __init__(self, name: str, value: int, cap: int) -> None:
        self.name, self.value, self.cap = name, value, cap
        super().__init__(f"Requested {name}={value}, which is greater than max allowed: "
                         f"{cap} (raise --max-logprobs to allow more).")


class SamplingType(enum.IntEnum):
    """How the sampler picks the next token of a request."""
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(enum.Enum):
    """What each streamed `RequestOutput` carries."""
    CUMULATIVE = 0
    """Everything generated so far."""
    DELTA = 1
    """Only what is new since the previous output."""
    FINAL_ONLY = 2
    """Nothing until the request finishes, then everything."""


@dataclass
class SamplingParams:
    """How to sample the completion(s) of one prompt (see vLLM's documentation).

    `top_k` 0 and -1 both mean "no top-k" (stored as 0); `temperature` below 1e-5
    means greedy, which turns top_p, top_k and min_p off.
    """

    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: Optional[dict[Union[int, str], float]] = None
    allowed_token_ids: Optional[list[int]] = None
    truncate_prompt_tokens: Optional[int] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: Optional[StructuredOutputsParams] = None
    extra_args: Optional[dict[str, Any]] = None
    thinking_token_budget: Optional[int] = None
    """Output tokens of reasoning after which the end-of-reasoning sequence
    (`thinking_end_token_ids`) is forced, then the answer follows (vLLM's field)."""
    thinking_end_token_ids: Optional[list[int]] = None
    """The end-of-reasoning token sequence the budget forces; the OpenAI server fills it
    from its `--reasoning-parser` (offline: give it with the budget)."""
    thinking_start_token_ids: Optional[list[int]] = None
    """The start-of-reasoning sequence (`<think>`), for a prompt that does not open the
    reasoning itself: the budget then counts from the output's first such sequence, and
    nothing is forced before the model opens its reasoning (as vLLM counts from the
    think start). None: counted from the output's first token (the template opened it).
    The OpenAI server fills it from its `--reasoning-parser` and the prompt."""

    # Set by update_from_generation_config (the model's end-of-sequence token).
    _eos_token_id: Optional[int] = field(default=None, init=False, repr=False)
    _bad_words_token_ids: Optional[list[list[int]]] = field(default=None, init=False,
                                                            repr=False)
    # Set by from_client: the fields the client left unset (None: built in Python).
    _client_unset: Optional[frozenset[str]] = field(default=None, init=False, repr=False)

    # ------------------------------------------------------------------ construction

    def __post_init__(self) -> None:
        self._normalize()
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the truncation knobs cannot change an argmax, so turn them off.
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0
            self._verify_greedy_sampling()
        elif self.temperature < _MIN_TEMP:
            logger.warning(
                "temperature %s is less than %s, which may cause numerical errors nan or "
                "inf in tensors. We have maxed it out to %s.",
                self.temperature, _MIN_TEMP, _MIN_TEMP)
            self.temperature = _MIN_TEMP

    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams":
        """Build from keyword arguments where None means "use the default".

        Request bodies of the OpenAI server send null for unset fields; fields whose
        default is itself None (seed, stop, logprobs...) keep None.
        """
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    @classmethod
    def from_client(cls, **sent: Any) -> "SamplingParams":
        """Params of a client's request (the OpenAI server), None marking what the client
        left unset.

        Unset fields take vLLM's defaults here, and are remembered: the input processor
        (vllm/engine/params.py) gives them the model's generation-config defaults, the
        one place that does. An unset max_tokens stays None ("as many as fit"), which
        the processor resolves against the prompt's length.
        """
        kwargs = {k: v for k, v in sent.items() if v is not None}
        if "max_tokens" in sent:
            kwargs.setdefault("max_tokens", None)
        params = cls(**kwargs)
        params._client_unset = frozenset(k for k, v in sent.items() if v is None)
        return params

    @property
    def client_unset_fields(self) -> Optional[frozenset[str]]:
        """Fields a client left unset (from_client); None for params built in Python,
        which are taken as given."""
        return self._client_unset

    def _normalize(self) -> None:
        """Bring equivalent spellings to one form before the range checks."""
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p", "min_p"):
            setattr(self, name, _as_float(name, getattr(self, name)))
        for name in ("n", "top_k", "min_tokens"):
            setattr(self, name, _as_int(name, getattr(self, name)))
        for name in ("best_of", "seed", "max_tokens", "logprobs", "prompt_logprobs",
                     "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, _as_int(name, value))
        if self.top_k == -1:
            self.top_k = 0
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self.bad_words = [] if self.bad_words is None else list(self.bad_words)
        if self.logit_bias is not None:
            self.logit_bias = _normalize_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as e:
                raise ValueError(f"structured_outputs: {e}") from None
        elif self.structured_outputs is not None and not isinstance(
                self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}.")
        if not isinstance(self.output_kind, RequestOutputKind):
            try:
                self.output_kind = RequestOutputKind(self.output_kind)
            except ValueError:
                raise ValueError(
                    f"output_kind must be one of {[k.name for k in RequestOutputKind]}, "
                    f"got {self.output_kind!r}.") from None

    def _verify_args(self) -> None:
        """Range checks with vLLM's bounds; each error names the field."""
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed must be a 64-bit signed integer, got {self.seed}.")
        if self.best_of is not None:
            if self.best_of < self.n:
                raise ValueError(
                    f"best_of must be greater than or equal to n, got n={self.n} and "
                    f"best_of={self.best_of}.")
            if self.best_of != self.n:
                raise ValueError(
                    f"best_of={self.best_of} > n={self.n} is not supported (as in vLLM "
                    "V1); leave best_of unset or equal to n.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not self.repetition_penalty > 0.0 or math.isinf(self.repetition_penalty):
            raise ValueError(
                f"repetition_penalty must be greater than zero, got "
                f"{self.repetition_penalty}.")
        if not self.temperature >= 0.0 or math.isinf(self.temperature):
            raise ValueError(
                f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(
                f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(
                f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < -1:
                raise ValueError(f"{name} must be non-negative or -1 (the whole "
                                 f"vocabulary), got {value}.")
        if self.truncate_prompt_tokens is not None and not (
                self.truncate_prompt_tokens == -1 or self.truncate_prompt_tokens >= 1):
            raise ValueError(
                f"truncate_prompt_tokens must be -1 or at least 1, got "
                f"{self.truncate_prompt_tokens}.")
        if self.thinking_token_budget is not None:
            if self.thinking_token_budget < 0:
                raise ValueError(f"thinking_token_budget must be non-negative, got "
                                 f"{self.thinking_token_budget}.")
            if not self.thinking_end_token_ids:
                raise ValueError("thinking_token_budget needs thinking_end_token_ids (the "
                                 "end-of-reasoning token sequence) to force.")
            _check_token_ids("thinking_end_token_ids", self.thinking_end_token_ids)
            if self.thinking_start_token_ids:
                _check_token_ids("thinking_start_token_ids", self.thinking_start_token_ids)
        self._verify_stop()
        if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise ValueError(f"bad_words must be a list of non-empty strings, got "
                             f"{self.bad_words!r}.")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty when given.")
            _check_token_ids("allowed_token_ids", self.allowed_token_ids)

    def _verify_stop(self) -> None:
        for s in self.stop:
            if not isinstance(s, str):
                raise ValueError(f"stop must be a string or a list of strings, got {s!r}.")
            if s == "":
                raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError(
                "stop strings are only supported when detokenize is True. "
                "Set detokenize=True to use stop.")
        _check_token_ids("stop_token_ids", self.stop_token_ids)

    def _verify_greedy_sampling(self) -> None:
        if self.n > 1:
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")

    # ------------------------------------------------------------------ model-dependent

    def update_from_generation_config(self, generation_config: dict[str, Any],
                                      eos_token_id: Optional[int] = None) -> None:
        """Record the model's end-of-sequence token(s).

        `eos_token_id` (the tokenizer's) stops the request unless ignore_eos, with no
        stop_reason. Extra eos ids listed in the model's generation_config become
        stop_token_ids (so they are reported as the stop_reason), unless ignore_eos.
        """
        self._eos_token_id = eos_token_id
        extra = generation_config.get("eos_token_id") if generation_config else None
        if extra is None:
            return
        extra_ids = {extra} if isinstance(extra, int) else set(extra)
        extra_ids.discard(eos_token_id)
        if extra_ids and not self.ignore_eos:
            known = set(self.stop_token_ids)
            self.stop_token_ids = self.stop_token_ids + sorted(extra_ids - known)

    def verify_against(self, vocab_size: int, max_logprobs: int) -> None:
        """Checks that need the model: token ids inside the vocabulary, logprob counts.

        `max_logprobs` < 0 means no cap beyond the vocabulary size. A logprobs count of
        -1 (the whole vocabulary, as in vLLM) becomes `vocab_size` here, so it passes
        only where the cap allows that many (--max-logprobs -1).
        """
        cap = vocab_size if max_logprobs < 0 else max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value == -1:
                value = vocab_size
                setattr(self, name, value)
            if value is not None and value > cap:
                raise LogprobsTooLargeError(name, value, cap)
        for name, ids in (("stop_token_ids", self.stop_token_ids),
                          ("allowed_token_ids", self.allowed_token_ids or []),
                          ("logit_bias", list(self.logit_bias or {}))):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(
                    f"{name} contains out-of-vocab token id(s) {bad[:10]}; token ids must "
                    f"be in [0, {vocab_size}).")

    # ------------------------------------------------------------------ derived values

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def eos_token_id(self) -> Optional[int]:
        """The tokenizer's eos id set by update_from_generation_config, if any."""
        return self._eos_token_id

    @property
    def bad_words_token_ids(self) -> Optional[list[list[int]]]:
        """The token sequences `bad_words` forbid (set by update_from_tokenizer)."""
        return self._bad_words_token_ids

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Tokenize `bad_words` (vLLM's name). Each word is forbidden as the tokenizer
        spells it at the start of a text and, where that differs, after a space (most
        tokenizers fold the space into the word's first token): the sampler then never
        lets the output end with one of these sequences."""
        if not self.bad_words:
            self._bad_words_token_ids = None
            return
        sequences: list[list[int]] = []
        for word in self.bad_words:
            bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            sequences.append(list(bare))
            if spaced and len(spaced) == len(bare) and spaced[0] != bare[0]:
                sequences.append(list(spaced))
        self._bad_words_token_ids = [s for s in sequences if s]

    @property
    def all_stop_token_ids(self) -> set[int]:
        """Token ids that finish the request: stop_token_ids, plus eos unless ignore_eos.

        The sampler also masks these while fewer than min_tokens were generated.
        """
        ids = set(self.stop_token_ids)
        if self._eos_token_id is not None and not self.ignore_eos:
            ids.add(self._eos_token_id)
        return ids

    @property
    def output_text_buffer_length(self) -> int:
        """Characters a streaming frontend holds back: a stop string may still begin there."""
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return max(len(s) for s in self.stop) - 1

    def clone(self) -> "SamplingParams":
        """A deep copy (children of an n>1 request each get their own)."""
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        return (
            f"SamplingParams(n={self.n}, "
            f"presence_penalty={self.presence_penalty}, "
            f"frequency_penalty={self.frequency_penalty}, "
            f"repetition_penalty={self.repetition_penalty}, "
            f"temperature={self.temperature}, "
            f"top_p={self.top_p}, "
            f"top_k={self.top_k}, "
            f"min_p={self.min_p}, "
            f"seed={self.seed}, "
            f"stop={self.stop}, "
            f"stop_token_ids={self.stop_token_ids}, "
            f"bad_words={self.bad_words}, "
            f"include_stop_str_in_output={self.include_stop_str_in_output}, "
            f"ignore_eos={self.ignore_eos}, "
            f"max_tokens={self.max_tokens}, "
            f"min_tokens={self.min_tokens}, "
            f"logprobs={self.logprobs}, "
            f"prompt_logprobs={self.prompt_logprobs}, "
            f"skip_special_tokens={self.skip_special_tokens}, "
            "spaces_between_special_tokens="
            f"{self.spaces_between_special_tokens}, "
            f"truncate_prompt_tokens={self.truncate_prompt_tokens}, "
            f"structured_outputs={self.structured_outputs}, "
            f"extra_args={self.extra_args})")


# ---------------------------------------------------------------------- helpers


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got nan.")
    return float(value)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    return value


def _check_token_ids(name: str, ids: list[Any]) -> None:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"{name} must contain non-negative integer token ids, got {t!r}.")


def _normalize_logit_bias(bias: dict[Union[int, str], float]) -> dict[int, float]:
    """Keys become ints (JSON sends strings), values are clamped to [-100, 100]."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {bias!r}.")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise ValueError
            token = int(key)
        except ValueError:
            raise ValueError(
                f"logit_bias keys must be token ids (int or a string of an int), got "
                f"{key!r}.") from None
        if token < 0:
            raise ValueError(f"logit_bias keys must be non-negative token ids, got {key!r}.")
        value = _as_float(f"logit_bias[{key!r}]", value)
        out[token] = min(_MAX_LOGIT_BIAS, max(-_MAX_LOGIT_BIAS, value))
    return out


@dataclass
class BeamSearchParams:
    """Parameters of `LLM.beam_search` (vLLM's fields)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.beam_width, bool) or not isinstance(self.beam_width, int) \
                or self.beam_width < 1:
            raise ValueError(f"beam_width must be an integer >= 1, got {self.beam_width!r}.")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) \
                or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}.")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}.")
        if not isinstance(self.length_penalty, (int, float)) or isinstance(
                self.length_penalty, bool):
            raise ValueError(f"length_penalty must be a number, got {self.length_penalty!r}.")
