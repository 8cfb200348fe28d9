"""vLLM's custom logits-processor API at vLLM's own import path, so a processor written
for vLLM runs unchanged. The implementation: vllm/sample/logits_processors/."""
from vllm.sample.logits_processors.adapter import AdapterLogitsProcessor
from vllm.sample.logits_processors.interface import (AddedRequest, BatchUpdate,
                                                     LogitsProcessor, MovedRequest,
                                                     MoveDirectionality, RemovedRequest)
from vllm.sample.logits_processors.load import LOGITSPROCS_GROUP
from vllm.sample.logits_processors.state import BatchUpdateBuilder

__all__ = ["LogitsProcessor", "BatchUpdate", "BatchUpdateBuilder", "MoveDirectionality",
           "AddedRequest", "MovedRequest", "RemovedRequest", "AdapterLogitsProcessor",
           "LOGITSPROCS_GROUP"]
