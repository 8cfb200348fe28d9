"""The worker-side weight-transfer engine: session rules and the in-place load.

A backend only says where the tensors come from (`receive_weights`); the session
rules (init before start, start before update, one session at a time) and the
load through the model's own `load_weights` live here, once.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from typing import Any, Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

NamedTensors = Iterator[tuple[str, torch.Tensor]]


def parse_info(cls: type, info: Any, what: str) -> Any:
    """`info` (a dict from the caller, JSON on the server) as the dataclass `cls`;
    ValueError naming unknown or missing keys."""
    if dataclasses.is_dataclass(info) and isinstance(info, cls):
        return info
    if not isinstance(info, dict):
        raise ValueError(f"{what} must be a dict, got {type(info).__name__}.")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(info) - known)
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(unknown)} (known: "
                         f"{', '.join(sorted(known)) or 'none'}).")
    try:
        return cls(**info)
    except TypeError as e:  # a required key is missing
        raise ValueError(f"{what}: {e}") from None


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"Unknown dtype name {name!r} (e.g. float32, bfloat16, float16).")
    return dtype


class _Tracked:
    """The tensors of a batch as the loader takes them: which one it holds (to name it
    in an error; None once all were taken) and how many it took."""

    def __init__(self, weights: NamedTensors) -> None:
        self._weights = weights
        self.current: Any = None
        self.count = 0

    def __iter__(self) -> NamedTensors:
        for name, tensor in self._weights:
            self.current = (name, tuple(tensor.shape))
            self.count += 1
            yield name, tensor
        self.current = None


@dataclasses.dataclass
class NoInitInfo:
    """The host-local backends need no rendezvous: init_info is an empty dict."""


class WeightTransferEngine(ABC):
    """One rank's receiver of new weights for `model`."""

    init_info_cls: type = NoInitInfo
    update_info_cls: type

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.initialized = False
        self.session_active = False
        self.num_updated = 0
        """Tensors loaded in the current session."""

    # ------------------------------------------------------------ phases
    def init_transfer_engine(self, init_info: Any) -> None:
        self.setup(parse_info(self.init_info_cls, init_info or {}, "init_info"))
        self.initialized = True

    def start_weight_update(self) -> None:
        if not self.initialized:
            raise ValueError("start_weight_update: the weight transfer engine is not "
                             "initialized; call init_weight_transfer_engine first.")
        if self.session_active:
            raise ValueError("start_weight_update: a weight update is already in progress; "
                             "call finish_weight_update first.")
        self.session_active = True
        self.num_updated = 0

    def update_weights(self, update_info: Any) -> int:
        """Load one batch of tensors in place; returns how many this rank loaded."""
        if not self.session_active:
            raise ValueError("update_weights: no weight update in progress; call "
                             "start_weight_update first.")
        info = parse_info(self.update_info_cls, update_info, "update_info")
        from vllm.model_executor.models.utils import weight_update_scope
        start = time.perf_counter()
        tracked = _Tracked(self.receive_weights(info))
        try:
            with torch.no_grad(), weight_update_scope():
                self.model.load_weights(tracked)
        except (RuntimeError, ValueError) as e:
            if tracked.current is None:  # raised after the last tensor (unknown names)
                raise
            name, shape = tracked.current
            raise ValueError(f"update_weights: {name!r} of shape {shape} does not fit this "
                             f"model's parameter: {e}") from e
        self.num_updated += tracked.count
        logger.info("Updated %d weight tensors in place in %.2f s.", tracked.count,
                    time.perf_counter() - start)
        return tracked.count

    def finish_weight_update(self) -> int:
        """End the session; returns how many tensors it loaded."""
        if not self.session_active:
            raise ValueError("finish_weight_update: no weight update in progress; call "
                             "start_weight_update first.")
        self.session_active = False
        return self.num_updated

    # ----------------------------------------------------------- backend
    def setup(self, init_info: Any) -> None:
        """Backend hook: open the transport (nothing for the host-local ones)."""

    @abstractmethod
    def receive_weights(self, update_info: Any) -> NamedTensors:
        """(checkpoint name, full unsharded tensor) of every weight of one batch."""


@dataclasses.dataclass
class WeightTransferInitRequest:
    """vLLM's request object of `init_weight_transfer_engine` (or {"init_info": ...})."""
    init_info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class WeightTransferUpdateRequest:
    """vLLM's request object of `update_weights` (or {"update_info": ...})."""
    update_info: dict = dataclasses.field(default_factory=dict)
