"""LoRARequest: the adapter one generation request runs with (vLLM's field names)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)


@dataclass
class LoRARequest:
    """An adapter in PEFT format, identified by a unique positive integer id.

    Two requests naming the same `lora_int_id` share the loaded adapter; the id is
    what the engine caches on (the name is for humans and the API's model list).
    """
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_local_path: Optional[str] = None
    """Deprecated alias of lora_path (as in vLLM)."""
    base_model_name: Optional[str] = None
    """The base model this adapter belongs to (shown as `parent` in /v1/models)."""
    tensorizer_config_dict: Optional[dict] = None
    """Tensorizer-serialized adapters are not supported (refused when set)."""
    load_inplace: bool = False
    """Reload the adapter's files even when one with this id is loaded already (its new
    weights replace the old ones for every later step), as vLLM: how RL loops push
    each training step's adapter to the same path."""
    generation: int = 0
    """Bumped by the engine at each in-place reload: part of the prefix-cache key, so
    KV computed with the old weights is never reused."""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) \
                or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer > 0, got {self.lora_int_id!r}.")
        if not self.lora_name:
            raise ValueError("lora_name must be a non-empty string.")
        if self.lora_local_path:
            logger.warning("LoRARequest.lora_local_path is deprecated; use lora_path.")
            if not self.lora_path:
                self.lora_path = self.lora_local_path
        if not self.lora_path:
            raise ValueError(f"lora_path of adapter {self.lora_name!r} must be given.")
        if self.tensorizer_config_dict is not None:
            raise ValueError("tensorizer_config_dict: tensorizer-serialized LoRA adapters are "
                             "not supported; save the adapter in PEFT format.")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def local_path(self) -> str:
        return self.lora_path

    @property
    def cache_key(self) -> tuple:
        """What prefix-cache block hashes include: KV computed under one adapter is never
        reused for another (nor for the base model, whose key is None)."""
        return ("lora", self.lora_int_id, self.lora_name, self.lora_path, self.generation)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
