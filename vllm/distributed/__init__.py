"""Process groups for tensor/pipeline parallelism and the collectives layers use."""
from vllm.distributed.communication_op import (tensor_model_parallel_all_gather,
                                               tensor_model_parallel_all_reduce)
from vllm.distributed.parallel_state import (GroupCoordinator, destroy_distributed_environment,
                                             destroy_model_parallel, get_pp_group,
                                             get_pipeline_model_parallel_rank,
                                             get_pipeline_model_parallel_world_size,
                                             get_tensor_model_parallel_rank,
                                             get_tensor_model_parallel_world_size, get_tp_group,
                                             init_distributed_environment,
                                             initialize_model_parallel,
                                             model_parallel_is_initialized)

__all__ = [
    "GroupCoordinator", "destroy_distributed_environment", "destroy_model_parallel",
    "get_pp_group", "get_pipeline_model_parallel_rank", "get_pipeline_model_parallel_world_size",
    "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size", "get_tp_group",
    "init_distributed_environment", "initialize_model_parallel", "model_parallel_is_initialized",
    "tensor_model_parallel_all_gather", "tensor_model_parallel_all_reduce",
]
