"""The structured-output state one engine request carries in the scheduler."""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.sampling_params import StructuredOutputsParams
from vllm.structured_output.backend_types import GrammarSpec, StructuredOutputGrammar


@dataclass
class StructuredOutputRequest:
    """A request's constraint: its compile future, then its matcher.

    The request waits (status WAITING_FOR_FSM) until `compiled` is done; the first
    scheduling after that builds `grammar`, this request's own matcher.
    `reasoning_ended` is False while the model is still in its reasoning part, which
    the constraint does not apply to.
    """
    params: StructuredOutputsParams
    spec: GrammarSpec
    backend: str
    compiled: Optional[Future] = None
    grammar: Optional[StructuredOutputGrammar] = None
    reasoning_ended: bool = True
    error: Optional[str] = None
    _extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_compiled(self) -> bool:
        return self.compiled is not None and self.compiled.done()
