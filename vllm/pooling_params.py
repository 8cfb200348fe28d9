"""PoolingParams: what a request to a pooling model (embedding, classifier, cross-encoder)
may ask for, with vLLM's names and checks.

A pooling request produces one vector from its prompt's hidden states in a single step
(no sampling): an embedding (`task="embed"`) or class scores (`task="classify"`).
`verify` fills the defaults of the task and refuses what the model cannot do, with a
ValueError naming the field, before the request reaches the engine.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from vllm.sampling_params import RequestOutputKind

if TYPE_CHECKING:
    from vllm.config import ModelConfig

POOLING_TASKS = ("embed", "classify")
"""The tasks served here: one vector per prompt (vLLM's token_embed / token_classify,
one vector per token, are refused)."""

_VALID_PARAMETERS = {"embed": ("dimensions", "use_activation"),
                     "classify": ("use_activation",)}
_REMOVED_TASKS = {"score": "`score` task was removed; use `classify` instead.",
                  "encode": "`encode` task was removed; use `token_embed` or "
                            "`token_classify` instead."}


@dataclass
class PoolingParams:
    """API parameters of a pooling request (vLLM 0.32's fields).

    use_activation: embed: L2-normalize the embedding; classify: softmax over the classes
        (sigmoid with one label). None: the model's default (True).
    dimensions: keep the first `dimensions` values of the embedding before normalizing
        (Matryoshka models only).
    """
    use_activation: Optional[bool] = None
    dimensions: Optional[int] = None
    task: Optional[str] = None
    """Set by the frontend (LLM.embed -> "embed", ...)."""
    requires_token_ids: bool = False
    extra_kwargs: Optional[dict[str, Any]] = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        if isinstance(self.task, str) and self.task in _REMOVED_TASKS:
            raise ValueError(_REMOVED_TASKS[self.task])
        if self.output_kind != RequestOutputKind.FINAL_ONLY:
            raise ValueError("For pooling output_kind has to be FINAL_ONLY, got "
                             f"{self.output_kind!r}")
        if self.dimensions is not None and (isinstance(self.dimensions, bool)
                                            or not isinstance(self.dimensions, int)):
            raise ValueError(f"dimensions must be an integer, got {self.dimensions!r}.")
        unknown = sorted(set(self.extra_kwargs or {}) - {"compressed_token_type_ids"})
        if unknown:
            raise ValueError(f"extra_kwargs {unknown} are not supported by the poolers of "
                             "this engine (known: compressed_token_type_ids).")

    def clone(self) -> "PoolingParams":
        return copy.deepcopy(self)

    def verify(self, task: str, model_config: "ModelConfig") -> None:
        """Set `task`, fill the model's defaults and check the fields against it."""
        if self.task is not None and self.task != task:
            raise ValueError(f"You cannot overwrite task={self.task!r} with task={task!r}!")
        if task not in POOLING_TASKS:
            raise ValueError(f"Unknown pooling task: {task!r}; supported: "
                             f"{', '.join(POOLING_TASKS)}.")
        self.task = task
        pooler = model_config.pooler_config
        for name in _VALID_PARAMETERS[task]:
            if getattr(self, name) is None and pooler is not None:
                setattr(self, name, getattr(pooler, name, None))
        invalid = [name for name in ("dimensions", "use_activation")
                   if name not in _VALID_PARAMETERS[task] and getattr(self, name) is not None]
        if invalid:
            raise ValueError(f"Task {task!r} only supports {list(_VALID_PARAMETERS[task])} "
                             f"parameters, does not support {invalid} parameters")
        if self.use_activation is None:
            self.use_activation = True
        if self.dimensions is not None:
            self._verify_dimensions(model_config)

    def compressed_token_type_ids(self) -> Optional[int]:
        """Where the second segment of a cross-encoder pair starts (token type 1 from
        there on), as vLLM passes it; None: one segment."""
        return (self.extra_kwargs or {}).get("compressed_token_type_ids")

    def _verify_dimensions(self, model_config: "ModelConfig") -> None:
        name = model_config.served_model_name[0]
        size = model_config.embedding_size
        if not model_config.is_matryoshka:
            raise ValueError(f"Model {name!r} does not support Matryoshka embeddings; "
                             f"dimensions must be unset (received dimensions="
                             f"{self.dimensions}).")
        if not 1 <= self.dimensions <= size:
            raise ValueError(f"Model {name!r} only supports dimensions in range [1, {size}], "
                             f"got {self.dimensions}.")
        allowed = model_config.matryoshka_dimensions
        if allowed is not None and self.dimensions not in allowed:
            raise ValueError(f"Model {name!r} only supports Matryoshka dimensions "
                             f"{allowed}, got {self.dimensions}.")


def check_pooling_prompt(prompt_token_ids: list[int], max_model_len: int) -> None:
    """A pooling prompt must be non-empty and fit the model in one pass."""
    if not prompt_token_ids:
        raise ValueError("The prompt cannot be empty.")
    if len(prompt_token_ids) > max_model_len:
        raise ValueError(f"This model's maximum context length is {max_model_len} tokens. "
                         f"However, you requested {len(prompt_token_ids)} tokens in the input "
                         "for pooling. Please reduce the length of the input.")
