"""`vllm.v1.sample.logits_processor.interface` (re-export)."""
from vllm.sample.logits_processors.interface import (AddedRequest, BatchUpdate,
                                                     LogitsProcessor, MovedRequest,
                                                     MoveDirectionality, RemovedRequest)

__all__ = ["LogitsProcessor", "BatchUpdate", "MoveDirectionality", "AddedRequest",
           "MovedRequest", "RemovedRequest"]
