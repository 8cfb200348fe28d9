"""The sampling stage in the HPU's fixed shapes: every device call tracked and warmed.

The flat stage (vllm/worker/sampling_stage.py) gathers the sampling rows of the
step's passes into one `[num_sampled, V]` sampler call. On Gaudi each new shape is a
graph compile, so here every pass is processed on its bucket's `[B, V]` logits:

- the structured-output bitmask over the whole bucket (unconstrained and padding rows
  allow every token) and the custom processors seeing the batch's `[max_num_seqs, V]`
  rows: one shape per B;
- the sampler (argmax or the "full" fixed-shape metadata of hpu/sampling.py, one per
  logprob bucket) and the rejection sampler on all B rows;
- prompt logprobs on the rows padded to the bucket's query length, K to its logprob
  bucket.

`warm_bucket` runs each of these shapes once per batch size during the warmup (the
runner's `run_dummy_batch`), so serving compiles nothing new; `CompileTracker`
counts any shape it did not see.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from vllm.core.sched_output import SchedulerOutput
from vllm.hpu.compile_tracker import CompileTracker
from vllm.hpu.input_prep import HPUBatch
from vllm.hpu.profiler import HPUProfiler
from vllm.hpu.sampling import (fixed_shapes, logprobs_bucket, logprobs_buckets,
                               sampler_signature, warmup_metadata)
from vllm.sample.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs
from vllm.sample.metadata import greedy_sample
from vllm.sample.ops.bitmask import apply_token_bitmask_, rows_bitmask
from vllm.sample.sampler import Sampler, SamplerOutput
from vllm.spec_decode.rejection_sampler import NO_DRAFT, rejection_sample
from vllm.worker.sampling_stage import (PendingPass, PromptLogprobs, SamplingStage,
                                        StepSamples)


class HPUSamplingStage(SamplingStage):
    """The sampling stage on bucketed passes (see the module doc)."""

    def __init__(self, flat: SamplingStage, tracker: CompileTracker, mode_name: str,
                 profiler: HPUProfiler, vocab_size: int, max_logprobs: int) -> None:
        """`flat`: the runner's flat stage, whose request states, batch, custom
        processors and speculative decoding this one takes over."""
        super().__init__(flat.requests, flat.input_batch, flat.custom_logitsprocs,
                         flat.spec_decode)
        self.sampler = Sampler(static_shapes=True)
        self.custom_static_width = self.input_batch.max_num_reqs
        self.tracker = tracker
        self.mode_name = mode_name
        """The execution mode's name, part of each tracked signature."""
        self.profiler = profiler
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs
        self._warmed: set = set()
        """Sampler shapes the warmup ran already (buckets share batch sizes)."""
        self._finalizer: Optional[tuple[Any, Callable[..., Any]]] = None

    # ---------------------------------------------------- logits processors
    def _apply_grammar_bitmask(self, logits: torch.Tensor, req_ids: list[Optional[str]],
                               so: SchedulerOutput) -> None:
        """On the whole bucket: unconstrained and padding rows allow every token."""
        bitmask = rows_bitmask([r or "" for r in req_ids], so.structured_output_request_ids,
                               so.grammar_bitmask, num_rows=logits.shape[0])
        if bitmask is not None:
            self.apply_bitmask(logits, bitmask)

    def _apply_custom_logitsprocs(self, logits: torch.Tensor,
                                  req_ids: list[Optional[str]]) -> torch.Tensor:
        """The custom processors on a bucket's [B, vocab] logits, seen as the batch's
        [max_num_seqs, vocab] rows: one shape per B (warmed with every bucket)."""
        signature = ("custom_logitsprocs", self.mode_name, tuple(logits.shape),
                     str(logits.dtype), self.custom_static_width)
        with self.tracker.track_pass(f"logits processors {tuple(logits.shape)}", signature):
            return super()._apply_custom_logitsprocs(logits, req_ids)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        """The bitmask on a bucket's [B, vocab] logits: one compiled shape per B
        (warmed up with every bucket), so constrained requests compile nothing new."""
        signature = ("bitmask", self.mode_name, tuple(logits.shape), str(logits.dtype),
                     tuple(bitmask.shape))
        with self.tracker.track_pass(f"bitmask {tuple(bitmask.shape)}", signature):
            apply_token_bitmask_(logits, bitmask.to(logits.device))

    # ------------------------------------------------------------- sampling
    def sample_passes(self, pending: list[PendingPass]) -> StepSamples:
        """Each pass sampled on its bucket's [B, vocab] logits (see hpu/sampling.py):
        no gather of the sampling rows, one warmed sampler shape per batch size."""
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list] = {}
        drafts = self.spec_decode.num_drafts if self.spec_decode is not None else {}
        with self.profiler.record("sample", rows=sum(len(p[0].sample_req_ids)
                                                     for p in pending)):
            for fwd, _, logits in pending:
                batch: HPUBatch = fwd.platform_data
                rows = {i: s.req_id for i, s in enumerate(batch.seqs) if s.sample}
                if any(r in drafts for r in rows.values()):
                    tokens, lps = self._verify_bucket(logits, rows)
                else:
                    tokens, lps = self._sample_bucket(logits, rows)
                sampled.update(tokens)
                logprobs.update(lps)
        return sampled, logprobs

    def _sample_bucket(self, logits: torch.Tensor, rows: dict[int, str]) -> StepSamples:
        """Sample all B rows of `logits` (dummy greedy rows where nobody samples), keep
        the rows of `rows` (bucket row -> request)."""
        req_ids = list(rows.values())
        lp_all = None
        md = self._bucket_metadata(logits, rows)
        if md is None:  # every sampling row takes the raw argmax
            tokens_all = self._run_argmax(logits).tolist()
        else:
            out = self._run_sampler(logits, md)
            tokens_all = out.sampled_token_ids.tolist()
            lp = out.logprobs_tensors
            if lp is not None:
                lp_all = lp.tolists()
        index = list(rows)
        lp_lists = None if lp_all is None else tuple([col[i] for i in index] for col in lp_all)
        return self._record_samples(req_ids, [tokens_all[i] for i in index], lp_lists)

    def _bucket_metadata(self, logits: torch.Tensor, rows: dict[int, str]) -> Any:
        """The batch's cached metadata for the bucket's rows, in fixed shapes."""
        return self.input_batch.sampling_metadata(
            [rows.get(i) for i in range(logits.shape[0])], logits.shape[-1], logits.device,
            finalize=self._fixed_shapes(logits.shape[-1], logits.device))

    def _fixed_shapes(self, vocab: int, device: torch.device) -> Callable[..., Any]:
        """`fixed_shapes` reading the batch's sampling state, whose tables the neutral
        forms read (the penalties' count table, allocated up front), so that every
        full sampler shape, penalized or not, is one shape (see vllm/hpu/sampling.py).
        One object per (vocab, device): the cached metadata is keyed on it."""
        key = (vocab, torch.device(device))
        if self._finalizer is None or self._finalizer[0] != key:
            self._finalizer = (key, functools.partial(fixed_shapes,
                                                      sampling=self.input_batch.sampling))
        return self._finalizer[1]

    def _verify_bucket(self, logits: torch.Tensor, rows: dict[int, str]) -> StepSamples:
        """Speculative decoding: the rejection sampler on all B rows of the decode
        bucket (a request's verification rows are consecutive, from row 0; padding
        rows are neutral greedy rows without a draft), one warmed shape per B."""
        req_ids = [rows[i] for i in range(len(rows))]
        md = self._bucket_metadata(logits, rows)
        with self.tracker.track_pass(f"rejection sampler {tuple(logits.shape)}",
                                     ("rejection", sampler_signature(logits, md))):
            order, result = self.spec_decode.verify(self.sampler, logits, req_ids, md)
        return self._record_verified(order, result)

    def _run_argmax(self, logits: torch.Tensor) -> torch.Tensor:
        signature = sampler_signature(logits, None)
        with self.tracker.track_pass(f"argmax {tuple(logits.shape)}", signature):
            return greedy_sample(logits)

    def _run_sampler(self, logits: torch.Tensor, md) -> SamplerOutput:
        signature = sampler_signature(logits, md)
        with self.tracker.track_pass(f"sampler {tuple(logits.shape)}", signature):
            return self.sampler(logits, md)

    # ------------------------------------------------------ prompt logprobs
    def _prompt_logprobs_rows(self, model: torch.nn.Module, fwd: Any, hidden: torch.Tensor,
                              rows: list[int], targets: list[int],
                              num_logprobs: int) -> PromptLogprobs:
        """Rows padded to the bucket's query length, K to its logprob bucket; the
        result cut back to the real rows and the K asked for."""
        batch: HPUBatch = fwd.platform_data
        width = max(len(rows), batch.row_stride if batch.is_prompt else 1)
        pad = width - len(rows)
        index = torch.tensor(rows + rows[-1:] * pad, device=hidden.device)
        logits = self._prompt_head(model, self._prompt_gather(hidden, index))
        target = torch.tensor(targets + [0] * pad, device=hidden.device)
        ids, lps, ranks = self._prompt_logprobs_of(logits, target, num_logprobs).tolists()
        n, k = len(rows), num_logprobs + 1
        return [r[:k] for r in ids[:n]], [r[:k] for r in lps[:n]], ranks[:n]

    def _prompt_gather(self, hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """hidden[index], tracked per hidden shape and width."""
        with self.tracker.track_pass(f"prompt logprobs gather {tuple(index.shape)}",
                                     ("prompt_logprobs_gather", tuple(hidden.shape),
                                      hidden.dtype, tuple(index.shape))):
            return hidden.index_select(0, index)

    def _prompt_head(self, model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        """The LM head on [width, hidden] rows, tracked per width."""
        with self.tracker.track_pass(f"prompt logprobs head {tuple(rows.shape)}",
                                     ("prompt_logprobs_head", tuple(rows.shape), rows.dtype)):
            return model.compute_logits(rows)

    def _prompt_log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        with self.tracker.track_pass(f"prompt logprobs {tuple(logits.shape)}",
                                     ("prompt_logprobs", tuple(logits.shape), logits.dtype)):
            return compute_logprobs(logits)

    def _prompt_logprobs_of(self, logits: torch.Tensor, target: torch.Tensor,
                            num_logprobs: int, logprobs: Optional[torch.Tensor] = None
                            ) -> LogprobsTensors:
        """Prompt logprobs with K rounded up to its bucket: the log-softmax tracked per
        width (or given, in warmup), the selection and top-K per width and bucket."""
        k = logprobs_bucket(num_logprobs, self.vocab_size)
        if logprobs is None:
            logprobs = self._prompt_log_softmax(logits)
        with self.tracker.track_pass(f"prompt logprobs top-k {tuple(logits.shape)} k={k}",
                                     ("prompt_logprobs_topk", tuple(logprobs.shape), k)):
            return gather_logprobs(logprobs, k, target)

    # --------------------------------------------------------------- warmup
    def warm_bucket(self, model: torch.nn.Module, batch: HPUBatch, hidden: torch.Tensor,
                    logits: torch.Tensor) -> None:
        """After a bucket's warmup forward: the bitmask and the custom processors on its
        [B, vocab] logits, then the samplers and prompt logprobs of its shapes."""
        words = (self.vocab_size + 31) // 32
        self.apply_bitmask(logits, torch.full((batch.bucket.batch_size, words), -1,
                                              dtype=torch.int32))
        if self.custom_logitsprocs is not None:
            self._apply_custom_logitsprocs(logits.clone(), [None] * logits.shape[0])
        self._warm_sampling(model, batch, hidden, logits)

    def _warm_sampling(self, model: torch.nn.Module, batch: HPUBatch, hidden: torch.Tensor,
                       logits: torch.Tensor) -> None:
        """The sampler (argmax and full, every logprob bucket) at the bucket's batch
        size, and with a prompt bucket its prompt-logprob gather and computation for
        every logprob bucket; each shape once (buckets share batch sizes)."""
        k_buckets = logprobs_buckets(self.max_logprobs, logits.shape[-1])
        key = ("sampler", tuple(logits.shape))
        if key not in self._warmed:
            self._warmed.add(key)
            self._run_argmax(logits.clone())
            for md in self._warmup_metadatas(logits, k_buckets):
                self._run_sampler(logits.clone(), md)
        key = ("rejection", tuple(logits.shape))
        if self.spec_decode is not None and not batch.is_prompt and key not in self._warmed:
            self._warmed.add(key)
            self._warm_rejection(logits, [None] + self._warmup_metadatas(logits, k_buckets))
        if batch.is_prompt:
            self._warm_prompt_logprobs(model, batch.row_stride, hidden, k_buckets)

    def _warm_prompt_logprobs(self, model: torch.nn.Module, width: int,
                              hidden: torch.Tensor, k_buckets: list[int]) -> None:
        """A prompt bucket's gather of `width` rows, then (once per width) the head
        and the logprobs of every logprob bucket."""
        gather = ("prompt_logprobs_gather", tuple(hidden.shape), width)
        if gather in self._warmed:
            return
        self._warmed.add(gather)
        rows = self._prompt_gather(hidden, torch.arange(width, device=hidden.device))
        if ("prompt_logprobs_head", width) in self._warmed:
            return  # the head and the logprobs of this width are warm already
        self._warmed.add(("prompt_logprobs_head", width))
        logits = self._prompt_head(model, rows)
        target = torch.zeros(width, dtype=torch.long, device=hidden.device)
        logprobs = self._prompt_log_softmax(logits)
        for k in k_buckets:
            self._prompt_logprobs_of(logits, target, k, logprobs)

    def _warmup_metadatas(self, logits: torch.Tensor, k_buckets: list[int]) -> list[Any]:
        """The full fixed-shape metadata of each logprob bucket (and none) at the
        logits' batch size."""
        vocab = logits.shape[-1]
        return [warmup_metadata(logits.shape[0], vocab, k, logits.device,
                                self.input_batch.sampling)
                for k in [None] + k_buckets]

    def _warm_rejection(self, logits: torch.Tensor, metadatas: list[Any]) -> None:
        """The rejection sampler at a decode bucket's batch size, for the argmax and
        every full metadata shape (what `_verify_bucket` runs)."""
        rows = logits.shape[0]
        for md in metadatas:
            with self.tracker.track_pass(f"rejection sampler {tuple(logits.shape)}",
                                         ("rejection", sampler_signature(logits, md))):
                rejection_sample(self.sampler, logits.clone(), md,
                                 torch.full((rows,), NO_DRAFT, device=logits.device),
                                 [0] * rows)
