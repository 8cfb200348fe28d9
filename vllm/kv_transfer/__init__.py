"""KV cache transfer: between engines (prefill/decode disaggregation), and between a
device cache and host memory (KV offloading, `offloading_connector.py`).

vLLM V1's KV-connector design. A connector has two halves, built by
`factory.KVConnectorFactory` for the role asking:

- its scheduler side (`scheduler_base.KVConnectorSchedulerBase`, in the engine core)
  says which prompt tokens of a waiting request another engine already computed
  (`get_num_new_matched_tokens`), learns which blocks they land in
  (`update_state_after_alloc`), describes the step's loads and saves to the workers
  (`build_connector_meta`) and hands `kv_transfer_params` back when a request ends
  (`request_finished`);
- its worker side (`worker_base.KVConnectorWorkerBase`, in each model runner) fetches
  and writes that KV before the forward (`start_load_kv`, `wait_for_layer_load`) and
  stores the KV a producer computed after it (`save_kv_layer`, `wait_for_save`).

The package sits beside `vllm.core` and `vllm.worker` rather than under
`vllm.distributed` (vLLM's place): the scheduler may not import the distributed layer,
and the scheduler halves here import no tensor library.
"""
from vllm.kv_transfer.config import KVTransferConfig

__all__ = ["KVTransferConfig"]
