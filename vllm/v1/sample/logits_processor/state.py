"""`vllm.v1.sample.logits_processor.state` (re-export)."""
from vllm.sample.logits_processors.state import BatchUpdateBuilder

__all__ = ["BatchUpdateBuilder"]
