"""Structured outputs: grammars compiled off the engine loop, applied as token bitmasks.

The scheduler owns a `StructuredOutputManager`. A constrained request's grammar is
compiled in a thread pool (the request waits in WAITING_FOR_FSM meanwhile, so the
compile never stalls other requests' steps); compiled grammars are cached by their
normalized spec. Each step the scheduler fills one bitmask row per constrained request
that samples (the model runner applies it to the logits), and advances each matcher
over the tokens the step accepted.
"""
from vllm.structured_output.backend_types import GrammarSpec, grammar_spec
from vllm.structured_output.manager import StructuredOutputManager, validate_structured_outputs
from vllm.structured_output.request import StructuredOutputRequest

__all__ = ["GrammarSpec", "StructuredOutputManager", "StructuredOutputRequest",
           "grammar_spec", "validate_structured_outputs"]
