"""In-place weight updates for RL loops: the worker side of vLLM's weight-transfer API.

A trainer hands new weights to a running engine in four phases (vLLM's names):
`init_weight_transfer_engine` (once), `start_weight_update`, `update_weights` (one or
more batches), `finish_weight_update`. Each rank reads every tensor of a batch from
the transport and copies it into its own parameters through the model's weight
loader, which takes the rank's tensor-parallel shard. The copies are in place: the
parameters keep their storage, so captured HPU graphs replay with the new values.
"""
from vllm.distributed.weight_transfer.base import WeightTransferEngine
from vllm.distributed.weight_transfer.factory import create_weight_transfer_engine
from vllm.distributed.weight_transfer.shm_engine import pack_into_shared_memory

__all__ = ["WeightTransferEngine", "create_weight_transfer_engine", "pack_into_shared_memory"]
