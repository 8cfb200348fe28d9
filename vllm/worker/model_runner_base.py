"""What every model runner does whatever the device: states, the step, the output.

One step (`execute_model`):

1. `_update_states`: follow the scheduler (new, resumed, finished requests, new
   blocks, tokens sampled on another rank) and keep the persistent input batch
   (`input_batch.py`) to the requests scheduled now;
2. `_prepare_inputs` (per platform): lay the scheduled tokens out as one or more
   `ForwardPass`es (token ids, positions, attention metadata, which rows belong to
   which request, which rows give sampling logits);
3. per pass, the feature hooks fill in what the pass needs beyond tokens (LoRA
   mapping, multimodal embeddings), then `_execute_pass` (per platform) runs the
   model and returns the hidden states and the sampling logits;
4. the sampling stage (`sampling_stage.py`, `self.sampling_stage`):
   `apply_logits_processors` (hook) on each pass's sampling logits, prompt logprobs
   from its hidden states;
5. its `sample_passes`: the argmax fast path or the sampler (or the verification of
   draft tokens), logprobs of the sampled tokens;
6. the `ModelRunnerOutput` (only the driver rank returns one).

A platform runner (`CPUModelRunner`, `HPUModelRunner`, `GPUModelRunner`) implements
only `_prepare_inputs`, `_execute_pass` and its setup (model loading, KV cache); a
platform with fixed shapes also puts its own form of the sampling stage in place.

Feature hooks (one call site each, here): `update_draft_tokens` (speculative
decoding), `prepare_lora_mapping` (LoRA), `gather_mm_embeddings` (multimodal),
`prepare_mrope_positions` (multimodal rotary positions), and the stage's
`apply_logits_processors` (structured outputs, custom logits processors). They
cost nothing while a feature is unused; the one whose feature is not implemented
yet (draft tokens) is an extension point that refuses its inputs with
NotImplementedError instead of ignoring them. docs/INTERNALS.md shows where each sits in the step.
"""
from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from vllm.attention.fp8_kv import kv_cache_torch_dtype
from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.forward_context import kv_layer_gate, set_forward_context
from vllm.lora.models import LoRAModelManager
from vllm.sample.logits_processors.custom import CustomLogitsProcessors
from vllm.sample.logits_processors.load import load_custom_logitsprocs
from vllm.sequence import IntermediateTensors
from vllm.spec_decode.spec_runner import SpecDecodeRunner
from vllm.worker.input_batch import InputBatch
from vllm.kv_cache_spec import KVCacheConfig, KVCacheSpec, get_kv_cache_config
from vllm.worker.kv_cache_alloc import wait_committed, zeroed_tensors
from vllm.worker.kv_cache_layout import (allocate_layer_caches, runner_kv_cache_specs,
                                         unique_tensors)
from vllm.worker.pooling_runner import execute_pooling
from vllm.worker.request_state import CachedRequestState
from vllm.worker.sampling_stage import PendingPass, PromptLogprobs, SamplingStage
from vllm.worker.state_cache import (StateCache, StateMetadata, set_state_metadata,
                                     state_share_per_block)
from vllm.worker.sleep_mode import (SLEEP_TAGS, SleepingWeights, check_level2_supported,
                                    check_sleep_level, check_wake_tags, release_weights,
                                    restore_weights, return_freed_host_memory)

logger = logging.getLogger(__name__)


@dataclass
class ForwardPass:
    """One model call: a platform's layout of (some of) the step's scheduled tokens.

    Each request of the pass owns the contiguous rows `row_offsets[i]` ..
    `row_offsets[i] + num_tokens[i] - 1` of the hidden states, holding its new tokens
    in order; other rows (padding) belong to nobody.
    """
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: Any
    req_ids: list[str]
    row_offsets: list[int]
    num_tokens: list[int]
    num_rows: int
    """Rows of the pass, padding included."""
    sample_req_ids: list[str]
    """Requests sampling after this pass (their new tokens reach the end of their known
    tokens), in the order of the rows of the pass's sampling logits."""
    platform_data: Any = None
    """Whatever the platform's `_execute_pass` needs besides (HPU: the bucketed batch)."""
    lora_mapping: Optional[Any] = None
    """Set by `prepare_lora_mapping` before the forward (None: no adapter in the pass)."""
    inputs_embeds: Optional[torch.Tensor] = None
    """Set by `gather_mm_embeddings` before the forward (None: embed `input_ids`)."""
    group_attn_metadata: Optional[list[Any]] = None
    """Attention metadata of KV cache groups 1.. (their own block tables; None with
    one group): layers find theirs through the forward context."""

    def row_request_index(self) -> np.ndarray:
        """[num_rows] int64: index into `req_ids` of the request owning each row, -1
        for padding. What a per-token mapping (LoRA slots) is built from."""
        owner = np.full(self.num_rows, -1, dtype=np.int64)
        for i, (start, n) in enumerate(zip(self.row_offsets, self.num_tokens)):
            owner[start:start + n] = i
        return owner


@dataclass
class PassOutput:
    hidden_states: torch.Tensor
    """[num_rows, hidden] of the pass (last pipeline stage)."""
    sample_logits: Optional[torch.Tensor]
    """[len(sample_req_ids), vocab]: logits at each sampling request's last new token
    (None when nobody samples), or, with `sample_rows`, a platform's fixed-shape
    logits of which `sample_rows` are those rows."""
    logits_req_ids: Optional[list[Optional[str]]] = None
    """With `sample_rows`: the request of each row of `sample_logits` (None: a row that
    does not sample). Without: `ForwardPass.sample_req_ids`."""
    sample_rows: Optional[torch.Tensor] = None


class ModelRunnerBase:
    """Platform-neutral half of a model runner (see the module docstring)."""

    supports_hybrid_kv_cache = False
    """Whether `_prepare_inputs` builds each KV cache group's metadata (its own block
    tables: vllm/kv_cache_spec.py); otherwise the engine keeps one group."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device | str) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.block_size = vllm_config.cache_config.block_size
        self.device = torch.device(device)
        self.dtype = self.model_config.torch_dtype
        self.kv_cache_dtype = kv_cache_torch_dtype(vllm_config.cache_config.cache_dtype,
                                                   self.dtype)
        """The KV caches' dtype: the model's, or fp8 (vllm/attention/fp8_kv.py)."""
        self.requests: dict[str, CachedRequestState] = {}
        self.custom_logitsprocs = build_custom_logitsprocs(vllm_config, self.device)
        """User logits processors (vLLM's API), or None (vllm/sample/logits_processors/)."""
        self.input_batch = InputBatch(vllm_config.scheduler_config.max_num_seqs,
                                      custom=self.custom_logitsprocs)
        self.model: Optional[torch.nn.Module] = None
        self.lora_manager: Optional[LoRAModelManager] = None
        """Set by a platform's load_model when LoRA is enabled (vllm/lora/models.py)."""
        self.kv_caches: list[torch.Tensor] = []
        self.num_kv_blocks = 0
        """Blocks of the KV cache (what a wake-up from sleep allocates again)."""
        self.kv_cache_config: Optional[KVCacheConfig] = None
        """How the KV cache is laid out (vllm/kv_cache_spec.py): given by the engine
        (every stage's layers), else built from this rank's specs when first needed."""
        self._kv_cache_specs: Optional[dict[int, KVCacheSpec]] = None
        self.encoder_cache: dict[str, torch.Tensor] = {}
        """Image content hash -> its encoder output [tokens, hidden] (see
        gather_mm_embeddings; the scheduler's EncoderCacheManager decides what stays)."""
        self.sleeping_tags: set[str] = set()
        """What sleep mode released and wake_up has not restored yet (sleep_mode.py)."""
        self._sleeping_weights: Optional[SleepingWeights] = None
        self.spec_decode: Optional[SpecDecodeRunner] = None
        """Speculative decoding's runner side (vllm/spec_decode/spec_runner.py)."""
        spec_config = getattr(vllm_config, "speculative_config", None)
        if spec_config is not None:
            self.spec_decode = SpecDecodeRunner(vllm_config, self.device)
        self.sampling_stage = SamplingStage(self.requests, self.input_batch,
                                            self.custom_logitsprocs, self.spec_decode)
        """Logits processors, prompt logprobs, sampling (sampling_stage.py; platforms
        with fixed shapes put their own form here)."""
        from vllm.attention.selector import backend_cls_of
        self.attn_impl = load_attn_impl(backend_cls_of(vllm_config))
        self.kv_connector: Optional[Any] = None
        """The KV connector's worker half (vllm/kv_transfer), set by init_kv_connector."""
        self.state_cache: Optional[StateCache] = None
        """State slots of the model's state-space layers (vllm/worker/state_cache.py);
        None for a model without any."""

    # ------------------------------------------------------------- platform
    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> list[ForwardPass]:
        """Lay out the scheduled tokens (`self.requests` is up to date) as passes."""
        raise NotImplementedError

    def _execute_pass(self, fwd: ForwardPass) -> Optional[PassOutput]:
        """Run the model on one pass; None on a rank that is not the last PP stage.

        Default (CPU, GPU): `_forward`, then logits at the rows listed in
        `fwd.platform_data` (one per sampling request).
        """
        with self.calibration(valid_rows=None):  # no padding rows in this layout
            hidden = self._forward(fwd)
        if hidden is None:
            return None
        logits = None
        if fwd.sample_req_ids:
            logits = self.model.compute_logits(self._rows(hidden, fwd.platform_data))
        return PassOutput(hidden_states=hidden, sample_logits=logits)

    # ------------------------------------------------- quantization (INC)
    def _inc_config(self) -> Any:
        qc = getattr(self.model_config, "quant_config", None)
        return qc if getattr(qc, "name", None) == "inc" else None

    @property
    def calibrating(self) -> bool:
        """An INC MEASURE run (QUANT_CONFIG mode MEASURE): layers record max-abs."""
        qc = self._inc_config()
        return qc is not None and qc.measuring

    def calibration(self, valid_rows: Optional[torch.Tensor]) -> contextlib.AbstractContextManager:
        """Around a served pass: arms INC's recorder with the pass's real-token rows
        (`[rows]` bool, None: all). Warmup and profiling passes never call it."""
        if not self.calibrating:
            return contextlib.nullcontext()
        return self._inc_config().recorder.recording(valid_rows)

    def finalize_calibration(self) -> Optional[str]:
        """Write INC's measurement (MEASURE runs; None otherwise): the json path."""
        qc = self._inc_config()
        return qc.finalize_calibration() if qc is not None else None

    def reload_quant_scales(self, dump_stats_path: Optional[str] = None) -> int:
        """INC QUANTIZE: input scales from another measurement, written in place."""
        qc = self._inc_config()
        if qc is None:
            raise ValueError("reload_quant_scales needs quantization='inc'.")
        return qc.reload_scales(dump_stats_path)

    def _rows(self, hidden: torch.Tensor, indices: list[int]) -> torch.Tensor:
        """hidden[indices]; no copy when they are all rows in order (a decode-only step)."""
        if len(indices) == hidden.shape[0] and indices[-1] == len(indices) - 1:
            return hidden
        return hidden[torch.tensor(indices, device=hidden.device)]

    # ---------------------------------------------------------------- sizes
    def _kv_heads_per_rank(self) -> int:
        tp = self.vllm_config.parallel_config.tensor_parallel_size
        if getattr(self.model_config, "use_mla", False):
            return 1  # the latent is shared by all heads, replicated on every rank
        return max(1, self.model_config.get_num_kv_heads() // tp)

    def _owned_layer_ids(self) -> list[int]:
        """Layers of this pipeline stage (all of them without pipeline parallelism)."""
        model = self.model
        start = getattr(model, "start_layer", None)
        end = getattr(model, "end_layer", None)
        if start is None and model is not None and hasattr(model, "model"):
            start = getattr(model.model, "start_layer", None)
            end = getattr(model.model, "end_layer", None)
        if start is None:
            return list(range(self.model_config.get_num_layers()))
        return list(range(start, end))

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """The KV cache spec of each layer this rank holds, collected from the loaded
        model's attention layers once."""
        if self._kv_cache_specs is None or self.model is None:
            self._kv_cache_specs = runner_kv_cache_specs(
                self.model, self.model_config, self.block_size, self.kv_cache_dtype,
                self._kv_heads_per_rank(), self._owned_layer_ids())
        return self._kv_cache_specs

    def get_kv_cache_config(self) -> KVCacheConfig:
        """The engine's layout, else one group over this rank's own layers."""
        if self.kv_cache_config is not None:
            return self.kv_cache_config
        config = get_kv_cache_config(self.get_kv_cache_spec(), hybrid=False)
        if self.model is not None:  # before loading, the specs are the config's guess
            self.kv_cache_config = config
        return config

    def _layer_groups(self) -> Optional[dict[int, int]]:
        """Layer -> KV cache group, for a config with more than one group."""
        config = self.kv_cache_config
        if config is None or len(config.kv_cache_groups) < 2:
            return None
        return config.group_of_layer()

    def get_kv_cache_block_bytes(self) -> int:
        """Bytes of one KV block id across all tensors this rank holds."""
        config, owned = self.get_kv_cache_config(), self._owned_layer_ids()
        target = config.block_bytes(owned) + state_share_per_block(
            config, owned, self.model_config.max_model_len, self.block_size)
        draft = self._draft_model()
        return target + (draft.block_bytes(self.kv_cache_dtype) if draft is not None else 0)

    # ------------------------------------------------- draft model (spec decode)
    def _draft_model(self) -> Optional[Any]:
        """The draft-model proposer of speculative decoding, if that is the method."""
        return self.spec_decode.draft_model if self.spec_decode is not None else None

    def _load_draft_model(self, load_fn: Any, make_pass: Any) -> None:
        """Platform setup hook: load the draft model with the platform's loader
        (`load_fn(vllm_config) -> model`); `make_pass(seqs, num_new) -> ForwardPass`
        lays out its passes. Only the driver rank proposes, so only it loads the draft
        (whole, TP 1); every rank counts its KV bytes, so their block counts agree."""
        draft = self._draft_model()
        if draft is not None and self.is_driver:
            draft.load(load_fn)
            draft.make_pass, draft.attn_impl = make_pass, self.attn_impl

    def _init_draft_kv_cache(self, num_blocks: int, cache_shape: Any) -> None:
        """The draft model's KV cache: the target's block count, the draft's shapes
        (`cache_shape(num_blocks, block_size, kv_heads, head_size)`: the platform's)."""
        draft = self._draft_model()
        if draft is not None:
            draft.initialize_kv_cache(num_blocks, self.kv_cache_dtype, cache_shape,
                                      zeroed_tensors)

    def _allocate_kv_caches(self, num_blocks: int, cache_shape: Any) -> list[torch.Tensor]:
        """One zeroed cache per tensor of the KV cache config, each layer given its
        tensor's (indexed by global layer index); layers of other PP stages get an
        empty placeholder. `cache_shape(num_blocks, block_size, kv_heads, head_size,
        parts)` is the platform's shape. Zeroed so that masked-out or padding slots never
        hold NaNs (see kv_cache_alloc.py)."""
        empty = torch.empty(0, dtype=self.kv_cache_dtype, device=self.device)

        def make(spec: Any, count: int) -> list[torch.Tensor]:
            shape = cache_shape(num_blocks, spec.block_size, spec.num_kv_heads,
                                spec.head_size, spec.num_parts)
            return zeroed_tensors(shape, spec.dtype, self.device, count)

        self._init_state_cache()
        return allocate_layer_caches(self.get_kv_cache_config(), self._owned_layer_ids(),
                                     self.model_config.get_num_layers(), make, empty)

    # ------------------------------------------------------ state-space layers
    def _init_state_cache(self) -> None:
        """Zeroed state slots (as many as the budget pays for, at most max_num_seqs: see
        KVCacheConfig.state_slots) and a pad slot, for this rank's state layers."""
        owned = set(self._owned_layer_ids())
        num_layers = self.model_config.get_num_layers()
        specs = {i: s for i, s in self.get_kv_cache_config().state_specs.items()
                 if i in owned or i >= num_layers}  # keyed past the layers: see kv_cache_layout
        self.state_cache = None
        if specs:
            slots = self.get_kv_cache_config().state_slots(
                self.num_kv_blocks, self.model_config.max_model_len, self.block_size,
                self.vllm_config.scheduler_config.max_num_seqs)
            self.state_cache = StateCache(specs, slots, self.device)
            logger.info("State slots: %d + 1 pad, %.2f MiB (%d state layers)",
                        self.state_cache.num_slots, self.state_cache.nbytes / 2**20, len(specs))

    def _update_state_slots(self, so: SchedulerOutput) -> None:
        """Free the slots of finished and preempted requests; zeroed slots for new and
        resumed ones (a resumed request recomputes from scratch)."""
        if self.state_cache is None:
            return
        self.state_cache.update(
            so.finished_req_ids, getattr(so, "preempted_req_ids", ()),
            [r.req_id for r in so.scheduled_new_reqs],
            [r.req_id for r in so.scheduled_cached_reqs if r.resumed_from_preemption])

    def _state_metadata(self, fwd: ForwardPass) -> Optional[StateMetadata]:
        """Where this pass's requests keep their states (flat layout; a platform with
        another layout overrides)."""
        if self.state_cache is None:
            return None
        return self.state_cache.flat_metadata(
            fwd.req_ids, fwd.row_offsets, fwd.num_tokens,
            [self.requests[r].num_computed_tokens for r in fwd.req_ids], self.device)

    # ---------------------------------------------------------- KV transfer
    def init_kv_connector(self) -> None:
        """Build the KV connector's worker half over this rank's caches (after
        initialize_kv_cache; a producer starts serving here)."""
        if getattr(self.vllm_config, "kv_transfer_config", None) is None:
            return
        from vllm.kv_transfer.factory import KVConnectorFactory, KVConnectorRole
        self.kv_connector = KVConnectorFactory.create_connector(self.vllm_config,
                                                                KVConnectorRole.WORKER)
        self.kv_connector.register_kv_caches(self.kv_layer_views())
        bind = getattr(self.kv_connector, "bind_kv_cache_config", None)
        if bind is not None:  # KV offloading: host blocks sized like the scheduler's
            bind(self.get_kv_cache_config())

    def kv_layer_views(self) -> dict[str, Any]:
        """This rank's layers as `KVLayerView`s by name, in forward order (default:
        torch_sdpa's head-major cache; HPU overrides)."""
        from vllm.kv_transfer.kv_io import FlatKVLayer
        return {f"layers.{i}": FlatKVLayer(lambda i=i: self.kv_caches[i])
                for i in self._owned_layer_ids()}

    def _load_kv(self, so: SchedulerOutput) -> None:
        """Before the forward: the connector fetches the step's loads and writes them
        layer by layer into the requests' blocks."""
        connector = self.kv_connector
        if connector is None or so.kv_connector_metadata is None:
            return
        connector.bind_connector_metadata(so.kv_connector_metadata)
        if self._loads_layerwise():
            connector.start_load_kv()  # asynchronous: the forward waits layer by layer
            return
        if so.kv_connector_metadata.loads:
            connector.start_load_kv()
            for name in connector.kv_caches:
                connector.wait_for_layer_load(name)

    def _save_kv(self, so: SchedulerOutput) -> Optional[Any]:
        """After the forward: the connector copies out the KV of the prompts this step
        completed (a producer), layer by layer; returns its report (failed loads)."""
        connector = self.kv_connector
        if connector is None or so.kv_connector_metadata is None:
            return None
        meta = so.kv_connector_metadata
        if self._loads_layerwise():
            connector.wait_for_all_loads()  # layers the passes did not reach
        if meta.saves:
            for name, view in connector.kv_caches.items():
                connector.save_kv_layer(name, view)
            connector.wait_for_save()
        connector.clear_connector_metadata()
        output = connector.connector_output()
        if meta.loads:
            output = self._agree_on_failed_loads(meta, output)
        return output

    def _loads_layerwise(self) -> bool:
        """Whether the connector loads asynchronously, each attention layer waiting for
        its own layer (KV offloading); the others load before the forward."""
        return hasattr(self.kv_connector, "wait_for_layer")

    def _kv_layer_gate(self) -> Any:
        """The step's forward passes run inside it: attention layers wait for their
        layer's KV while an asynchronous connector load is under way."""
        return kv_layer_gate(self.kv_connector.wait_for_layer
                             if self._loads_layerwise() else None)

    def _wait_kv_loads(self) -> None:
        """Before a pass that cannot wait layer by layer (a replayed graph)."""
        if self._loads_layerwise():
            self.kv_connector.wait_for_all_loads()

    @staticmethod
    def _agree_on_failed_loads(meta: Any, output: Optional[Any]) -> Optional[Any]:
        """Each rank loads its own shard (and stage) of the KV: a load that failed on
        any rank failed for the request, which only the driver reports. Every rank
        runs the same reductions (the metadata is the same everywhere)."""
        tp, pp = get_tp_group(), get_pp_group()
        if tp.world_size == 1 and pp.world_size == 1:
            return output
        from vllm.kv_transfer.metadata import KVConnectorOutput
        failed = output.failed_recving if output is not None else set()
        agreed = {load.req_id for load in meta.loads
                  if pp.all_reduce_int(tp.all_reduce_int(int(load.req_id in failed), "max"),
                                       "max")}
        return KVConnectorOutput(failed_recving=agreed) if agreed else None

    def shutdown_kv_connector(self) -> None:
        if self.kv_connector is not None:
            self.kv_connector.shutdown()
            self.kv_connector = None

    # ----------------------------------------------------------- sleep mode
    def sleep(self, level: int) -> None:
        """Free the KV cache; offload (level 1) or discard (level 2) the weights.

        The engine asks only while no request runs (vllm/engine/core.py), so no
        request state refers to the freed blocks."""
        check_sleep_level(level)
        if self.sleeping_tags:
            raise ValueError("The worker is already asleep; call wake_up() first.")
        if level == 2:
            check_level2_supported(self.vllm_config)
        if self._loads_layerwise():
            self.kv_connector.wait_idle()  # the last step's stores still read the cache
        kv_bytes = sum(t.numel() * t.element_size() for t in self._cache_tensors())
        self.kv_caches = []
        draft = self._draft_model()
        if draft is not None:  # its cache comes back with the target's (initialize_kv_cache)
            draft.kv_caches = []
        self._release_kv_cache()
        self._weights_released()
        self._sleeping_weights = release_weights(self.model, level, self.device)
        self.sleeping_tags = set(SLEEP_TAGS)
        gc.collect()  # what still points at the old tensors (reference cycles)
        # A background commit of the released cache stops at its next slice; until
        # then it holds the mapping (vllm/worker/kv_cache_alloc.py).
        wait_committed(timeout=5.0)
        return_freed_host_memory()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the caching allocator keeps freed blocks otherwise
        logger.info("Sleep mode level %d: freed %.1f MiB of KV cache; weights %s.", level,
                    kv_bytes / 2**20, "offloaded to host memory" if level == 1 else
                    "discarded")

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore what `sleep` released: all of it, or only the given tags."""
        for tag in check_wake_tags(tags):
            if tag not in self.sleeping_tags:
                continue
            if tag == "weights":
                restore_weights(self.model, self._sleeping_weights, self.device,
                                self.vllm_config)
                self._sleeping_weights = None
                self._weights_restored()
            else:
                self._restore_kv_cache()
            self.sleeping_tags.discard(tag)
            logger.info("Woke up: %s restored.", tag)

    def _cache_tensors(self) -> list[torch.Tensor]:
        """Every KV cache tensor of this rank."""
        return unique_tensors(self.kv_caches)

    def _release_kv_cache(self) -> None:
        """Platform hook: drop whatever else refers to the KV cache (`kv_caches` is
        cleared already)."""

    def _restore_kv_cache(self) -> None:
        """A fresh, zeroed KV cache of the size the engine chose at start."""
        self.initialize_kv_cache(self.num_kv_blocks)

    def _weights_released(self) -> None:
        """Platform hook, before the weights leave the device (memory accounting)."""

    def _weights_restored(self) -> None:
        """Platform hook, after the weights are back (e.g. repack them for kernels)."""

    def flush_weight_copies(self) -> None:
        """After each batch of an in-place weight update: make the copies happen now
        (a lazy device would otherwise hold every batch's host tensors until the end)."""

    def weights_updated(self) -> None:
        """After an in-place weight update: the values changed, the storage did not.
        Copies derived from the weights (the CPU's packed linears) are made again."""
        self._weights_restored()

    @property
    def is_driver(self) -> bool:
        """The rank that samples (TP rank 0 of the last PP stage); the others learn the
        tokens from the next SchedulerOutput."""
        return get_tp_group().is_first_rank and get_pp_group().is_last_rank

    # ----------------------------------------------------------------- step
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput
                      ) -> Optional[ModelRunnerOutput]:
        """One step. Only the driver returns an output (see the module docstring)."""
        self.sampling_stage.start_step()
        self._update_states(scheduler_output)
        self._load_kv(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            self._save_kv(scheduler_output)
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        if getattr(self.model_config, "runner_type", "generate") == "pooling":
            return execute_pooling(self, scheduler_output)
        pending: list[PendingPass] = []
        prompt_lps: dict[str, PromptLogprobs] = {}
        for fwd in self._prepare_inputs(scheduler_output):
            fwd.lora_mapping = self.prepare_lora_mapping(fwd)
            fwd.inputs_embeds = self.gather_mm_embeddings(fwd)
            fwd.positions = self.prepare_mrope_positions(fwd)
            try:
                with self._kv_layer_gate():
                    out = self._execute_pass(fwd)
            finally:
                if fwd.lora_mapping is not None:
                    self.lora_manager.clear_mapping()
            if out is None:
                continue  # an earlier pipeline stage: the hidden states went on
            if fwd.sample_req_ids:
                logits = self.sampling_stage.apply_logits_processors(
                    out.sample_logits, out.logits_req_ids or fwd.sample_req_ids,
                    scheduler_output)
                pending.append((fwd, out, logits))
            self.sampling_stage.prompt_logprobs(self.model, fwd, out.hidden_states,
                                                scheduler_output, prompt_lps)
        if self.spec_decode is not None:
            self.spec_decode.remove_drafts(self.requests)
        kv_output = self._save_kv(scheduler_output)
        if not self.is_driver:
            return None
        sampled, logprobs = self.sampling_stage.sample_passes(pending)
        failed = self.sampling_stage.failed_requests
        for req_id in failed:
            sampled.pop(req_id, None)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        return ModelRunnerOutput(
            req_ids=req_ids, sampled_token_ids=[sampled.get(r, []) for r in req_ids],
            logprobs=[logprobs.get(r) for r in req_ids] if logprobs else None,
            prompt_logprobs=prompt_lps,
            spec_token_ids=self._propose_drafts(sampled), kv_connector_output=kv_output,
            failed_req_ids=dict(failed))

    def pooled_rows(self, fwd: ForwardPass, hidden: torch.Tensor,
                    indices: list[int]) -> torch.Tensor:
        """Pooling runner (worker/pooling_runner.py): [len(indices), out] float32, the
        pooled vectors of requests `fwd.req_ids[i]` for i in `indices` (before their
        params' normalize / softmax). Flat layouts pool just those requests' rows; HPU
        pools the whole bucket at a fixed shape."""
        return self.model.pooler.pooled(hidden, [fwd.row_offsets[i] for i in indices],
                                        [fwd.num_tokens[i] for i in indices])

    def _forward(self, fwd: ForwardPass) -> Optional[torch.Tensor]:
        """The model on one pass in its forward context, as a pipeline stage: receives
        the previous stage's activations, sends its own on; None except on the last."""
        pp = get_pp_group()
        intermediate = None
        if not pp.is_first_rank:
            intermediate = IntermediateTensors(pp.recv_tensor_dict(device=self.device))
        with set_forward_context(fwd.attn_metadata, self.kv_caches, self.attn_impl,
                                 fwd.group_attn_metadata, self._layer_groups()), \
                set_state_metadata(self._state_metadata(fwd)):
            if fwd.inputs_embeds is None:
                hidden = self.model(fwd.input_ids, fwd.positions, intermediate)
            else:
                hidden = self.model(fwd.input_ids, fwd.positions, intermediate,
                                    inputs_embeds=fwd.inputs_embeds)
        if not pp.is_last_rank:
            pp.send_tensor_dict(hidden.tensors)
            return None
        return hidden

    def _update_states(self, so: SchedulerOutput) -> None:
        """Bring request states and the persistent batch in line with `so`."""
        self.free_encoder_outputs(so)
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            self.input_batch.remove_request(req_id)
        # Not scheduled now (preempted or out of budget): keep the state, free the row.
        self.input_batch.retain_only(so.num_scheduled_tokens)
        for new in so.scheduled_new_reqs:
            state = CachedRequestState.from_new_request(new, self.device)
            self.requests[new.req_id] = state
            self.input_batch.add_request(state)
        for cached in so.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            if cached.resumed_from_preemption:
                state.block_ids = list(cached.new_block_ids)
                state.group_block_ids = [list(t) for t in cached.new_group_block_ids]
            else:
                state.block_ids.extend(cached.new_block_ids)
                for table, new_ids in zip(state.group_block_ids, cached.new_group_block_ids):
                    table.extend(new_ids)
            state.num_computed_tokens = cached.num_computed_tokens
            missing = cached.num_tokens - state.num_tokens
            if missing > 0:  # this rank did not sample them itself
                new_tokens = cached.new_token_ids[-missing:]
                for token_id in new_tokens:
                    state.append_token(token_id)
                if cached.req_id in self.input_batch:
                    self.input_batch.record_output_tokens([cached.req_id] * len(new_tokens),
                                                          new_tokens)
            if cached.req_id not in self.input_batch:
                self.input_batch.add_request(state)
        self.input_batch.condense()
        self.sampling_stage.batch_updated()
        self._update_state_slots(so)
        self.update_draft_tokens(so)

    # ------------------------------------------------ speculative decoding
    def _propose_drafts(self, sampled: dict[str, list[int]]) -> dict[str, list[int]]:
        """The next step's drafts (driver rank; none without speculative decoding)."""
        if self.spec_decode is None or not sampled:
            return {}
        return self.spec_decode.propose(self.requests, sampled)

    # ---------------------------------------------------------- feature hooks
    def update_draft_tokens(self, so: SchedulerOutput) -> None:
        """Speculative decoding hook, called once per step at the end of `_update_states`.

        Places each request's scheduled draft tokens (`so.scheduled_spec_decode_tokens`)
        after its known tokens, so that `_prepare_inputs` lays them out like any other
        new token and gives their rows logits (`num_draft_tokens`); the sampling
        stage then verifies them and may return several tokens per request. They leave the
        states again right after the forward. Refuses drafts when speculative
        decoding is not configured.
        """
        if self.spec_decode is not None:
            self.spec_decode.place_drafts(so, self.requests)
        elif so.scheduled_spec_decode_tokens:
            raise NotImplementedError(
                "speculative decoding: draft tokens were scheduled for "
                f"{sorted(so.scheduled_spec_decode_tokens)}, but this engine was not started "
                "with a speculative_config.")

    @property
    def num_draft_tokens(self) -> dict[str, int]:
        """Requests verifying draft tokens this step -> how many (their last k + 1 new
        tokens give sampling logits)."""
        return self.spec_decode.num_drafts if self.spec_decode is not None else {}

    def prepare_lora_mapping(self, fwd: ForwardPass) -> Optional[np.ndarray]:
        """LoRA hook, called once per pass after `_prepare_inputs`, before the forward.

        Makes the pass's adapters resident and gives the LoRA layers each row's adapter
        slot (-1: base model; padding rows too), built from `fwd.row_request_index()`;
        returns that per-row mapping (`fwd.lora_mapping`), which `execute_model` clears
        after the forward. None when no request of the pass has an adapter. Refuses
        adapters when the runner has no LoRA manager (LoRA not enabled, or a platform
        without LoRA support).
        """
        states = [self.requests[r] for r in fwd.req_ids]
        if all(st.lora_request is None for st in states):
            return None
        if self.lora_manager is None:
            self._refuse_requests_with(fwd.req_ids, "lora_request", "LoRA adapters")
        slot_of = self.lora_manager.activate(
            [st.lora_request for st in states if st.lora_request is not None])
        per_request = np.array([-1 if st.lora_request is None
                                else slot_of[st.lora_request.lora_int_id] for st in states]
                               + [-1], dtype=np.int64)
        slots = per_request[fwd.row_request_index()]  # index -1: padding, the last entry
        self.lora_manager.set_token_slots(slots, self.device)
        return slots

    def gather_mm_embeddings(self, fwd: ForwardPass) -> Optional[torch.Tensor]:
        """Multimodal hook, called once per pass after `prepare_lora_mapping`.

        Returns the pass's input embeddings with the encoder outputs of its requests'
        images written over their placeholder rows (`_execute_pass` then feeds
        `fwd.inputs_embeds` instead of the token ids), or None for a pass with no
        placeholder token in it. An image's encoder output is computed once and kept in
        `encoder_cache` by its content hash until the scheduler frees it
        (`SchedulerOutput.free_encoder_mm_hashes`), so a prompt split over several steps,
        or another request with the same image, does not run the encoder again.
        """
        if not getattr(self.model, "supports_multimodal", False):
            self._refuse_requests_with(fwd.req_ids, "mm_inputs", "multimodal inputs")
            return None
        if not get_pp_group().is_first_rank:
            return None  # later pipeline stages start from the previous stage's states
        spans = self._mm_spans(fwd)
        if not spans:
            return None
        self._run_encoder([f for f, _, _, _ in spans])
        embeds = self.model.get_input_embeddings(fwd.input_ids)
        for feature, row, lo, hi in spans:
            out = self.encoder_cache[feature.identifier]
            embeds[row:row + hi - lo] = out[lo:hi].to(embeds.dtype)
        return embeds

    def prepare_mrope_positions(self, fwd: ForwardPass) -> torch.Tensor:
        """M-RoPE hook, called once per pass after `gather_mm_embeddings`.

        A model with multimodal rotary positions (`uses_mrope`: Qwen2.5-VL) takes
        [3, rows] positions (t, h, w; vllm/multimodal/mrope.py): every pass of it
        gets them, so a platform with fixed shapes sees one shape per bucket. Other
        models keep `fwd.positions`.
        """
        if not getattr(self.model, "uses_mrope", False):
            return fwd.positions
        from vllm.multimodal.mrope import pass_mrope_positions
        return pass_mrope_positions(self.model, self.requests, fwd.req_ids, fwd.row_offsets,
                                    fwd.num_tokens, fwd.positions)

    def _mm_spans(self, fwd: ForwardPass) -> list[tuple[Any, int, int, int]]:
        """(feature, first row, lo, hi) for each image whose placeholder tokens lo..hi-1
        (relative to the image) are among the pass's rows."""
        spans = []
        for req_id, offset, n in zip(fwd.req_ids, fwd.row_offsets, fwd.num_tokens):
            state = self.requests[req_id]
            if not state.mm_inputs:
                continue
            start = state.num_computed_tokens
            for feature in state.mm_inputs:
                if feature.overlaps(start, start + n):
                    lo = max(start, feature.offset)
                    hi = min(start + n, feature.end)
                    spans.append((feature, offset + lo - start, lo - feature.offset,
                                  hi - feature.offset))
        return spans

    def _run_encoder(self, features: list[Any]) -> None:
        """Encode, in one batch, the images of `features` not in the encoder cache."""
        todo = {f.identifier: f for f in features if f.identifier not in self.encoder_cache}
        if not todo:
            return
        outputs = self._encode_mm_items([f.data for f in todo.values()])
        for (key, feature), out in zip(todo.items(), outputs):
            if out.shape[0] != feature.length:
                raise ValueError(f"The vision encoder gave {out.shape[0]} embeddings for an "
                                 f"image with {feature.length} placeholder tokens.")
            self.encoder_cache[key] = out

    def _encode_mm_items(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """The vision encoder on a batch of images (HPU: padded to bucketed sizes)."""
        return self.model.embed_multimodal(items)

    def free_encoder_outputs(self, so: SchedulerOutput) -> None:
        """Drop the encoder outputs the scheduler evicted from its mirror of the cache."""
        for key in so.free_encoder_mm_hashes:
            self.encoder_cache.pop(key, None)

    def _refuse_requests_with(self, req_ids: list[str], field_name: str, feature: str) -> None:
        """NotImplementedError naming the first request whose state sets `field_name`."""
        for req_id in req_ids:
            if getattr(self.requests[req_id], field_name) is not None:
                raise NotImplementedError(
                    f"request {req_id!r} sets {field_name}, but this model runner does not "
                    f"serve {feature} (not enabled, or not supported on this platform yet).")


def build_custom_logitsprocs(vllm_config: VllmConfig, device: torch.device
                             ) -> Optional[CustomLogitsProcessors]:
    """The engine's custom logits processors (installed plugins and the configured ones),
    constructed once per runner; refused where they cannot run (as vLLM: pooling
    models; here also speculative decoding, whose verification rows they would not
    see)."""
    model_config = vllm_config.model_config
    classes = load_custom_logitsprocs(getattr(model_config, "logits_processors", None))
    if not classes:
        return None
    if getattr(model_config, "runner_type", "generate") == "pooling":
        raise ValueError("Pooling models do not support custom logits processors.")
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise ValueError("Custom logits processors are not supported with speculative "
                         "decoding.")
    return CustomLogitsProcessors.build(vllm_config, device, classes)


def load_attn_impl(qualname: str) -> Any:
    """The instance of the attention backend class named `module.Class` that the
    model's Attention layers also use (attention/selector.py)."""
    from vllm.attention.selector import load_attn_backend
    return load_attn_backend(qualname)
