"""`LLM`'s RL surface (vLLM's names): in-place weight updates and their version.

    llm.init_weight_transfer_engine({"init_info": {}})       # once
    llm.start_weight_update()
    llm.update_weights({"update_info": {...}})                # one or more batches
    llm.finish_weight_update(weight_version="step-1")         # prefix cache invalidated

Each call is one engine utility (vllm/engine/utility.py), run between two steps on
every rank; the backends are in vllm/distributed/weight_transfer/.
"""
from __future__ import annotations

from typing import Any, Optional

from vllm.engine.weight_requests import request_info


class WeightUpdateOfflineMixin:
    llm_engine: Any

    def init_weight_transfer_engine(self, request: Any) -> None:
        """Open the weight transfer engine of `weight_transfer_config` on every rank;
        `request` is a WeightTransferInitRequest or {"init_info": {...}}."""
        self.llm_engine.call_utility("init_weight_transfer_engine",
                                     request_info(request, "init_info"))

    def start_weight_update(self) -> None:
        """Begin a weight update (one at a time)."""
        self.llm_engine.call_utility("start_weight_update")

    def update_weights(self, request: Any) -> None:
        """Copy one batch of new weights into the model on every rank, in place;
        `request` is a WeightTransferUpdateRequest or {"update_info": {...}}."""
        self.llm_engine.call_utility("update_weights", request_info(request, "update_info"))

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        """End the update: later requests see only the new weights (no cached prefix
        computed before is reused); label the weights `weight_version` if given."""
        self.llm_engine.call_utility("finish_weight_update", weight_version)

    def update_weight_version(self, new_version: str) -> None:
        """Label the weights served without changing them."""
        self.llm_engine.call_utility("update_weight_version", new_version)

    def get_weight_version(self) -> Optional[str]:
        """The label of the last finished update (None before any)."""
        return self.llm_engine.call_utility("get_weight_version")
