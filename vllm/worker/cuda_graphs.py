"""CUDA graphs: a step's whole forward captured once per size, replayed padded.

A batch-1 decode of a 1B model launches ~400 kernels of a few microseconds each;
eagerly the host cannot issue them as fast as the GPU runs them. A CUDA graph
issues them all with one launch. vLLM's scheme, as here:

- At start-up, after the KV cache exists, one graph is captured per size of
  `compilation_config.cudagraph_capture_sizes` (token counts of a step), largest
  first, all in one memory pool (a smaller graph reuses the larger ones' memory).
- A step of n tokens from m sequences (m <= n) replays the smallest captured size
  N >= n. Its inputs are copied into the graph's static buffers: rows n..N-1 are
  padding (token 0, position 0, cache slot -1: nothing is written), sequences
  m..N-1 own no rows and no cached tokens (nothing is read). The attention kernels
  take decodes and prefills alike (attention/backends/triton_attn.py), so FULL mode
  replays any batch of at most the largest size; FULL_DECODE_ONLY only batches of
  decodes; larger steps, and NONE, run eagerly.
- The logits and the sampler run after the graph, on the real rows only.

`graph_factory` makes the graph objects: `torch.cuda.CUDAGraph` on a GPU. The tests
pass `EagerGraph`, which records the function at "capture" and calls it again at
"replay", so the padding and the static buffers are checked on CPU.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from vllm.attention.backends.triton_attn import TritonAttentionMetadata, TritonInputs

logger = logging.getLogger(__name__)

PADDING_SLOT = -1
"""Cache slot of a padding row: the cache-write kernel skips it."""

ForwardFn = Callable[[torch.Tensor, torch.Tensor, TritonAttentionMetadata], torch.Tensor]
"""(input_ids, positions, metadata) -> hidden states, the model in its forward context."""


class EagerGraph:
    """A stand-in for torch.cuda.CUDAGraph off a GPU: `capture` records the function,
    `replay` calls it again (on the same static buffers) and, as a graph does, leaves
    the result in the tensor the capture returned."""

    def __init__(self) -> None:
        self._fn: Optional[Callable[[], torch.Tensor]] = None
        self._out: Optional[torch.Tensor] = None

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any = None) -> torch.Tensor:
        self._fn = fn
        self._out = fn()
        return self._out

    def replay(self) -> None:
        assert self._fn is not None and self._out is not None
        self._out.copy_(self._fn())


class TorchCudaGraph:
    """torch.cuda.CUDAGraph behind EagerGraph's two calls."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any = None) -> torch.Tensor:
        with torch.cuda.graph(self.graph, pool=pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()

    def pool(self) -> Any:
        return self.graph.pool()


@dataclass
class StaticBuffers:
    """The inputs every graph reads, sized for the largest one (graph N uses [:N])."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor

    @classmethod
    def allocate(cls, max_size: int, max_blocks: int, device: torch.device) -> "StaticBuffers":
        ints = dict(dtype=torch.int32, device=device)
        return cls(input_ids=torch.zeros(max_size, dtype=torch.long, device=device),
                   positions=torch.zeros(max_size, dtype=torch.long, device=device),
                   slot_mapping=torch.full((max_size,), PADDING_SLOT, dtype=torch.long,
                                           device=device),
                   query_start_loc=torch.zeros(max_size + 1, **ints),
                   seq_lens=torch.zeros(max_size, **ints),
                   block_table=torch.zeros(max_size, max_blocks, **ints))

    def metadata(self, size: int, block_size: int) -> TritonAttentionMetadata:
        """The views graph `size` is captured on (and replays with)."""
        return TritonAttentionMetadata(
            slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size], block_table=self.block_table[:size],
            block_size=block_size)


def padded_host_inputs(inputs: TritonInputs, token_ids: np.ndarray, positions: np.ndarray,
                       size: int, max_blocks: int) -> dict[str, np.ndarray]:
    """The static buffers' first `size` entries for a step of `inputs` (n tokens, m
    sequences, n <= size): padding rows write nothing, padding sequences read nothing.
    The block table keeps only the columns the step's sequences use."""
    n, m = inputs.num_tokens, inputs.num_seqs
    if n > size or m > size:
        raise ValueError(f"a step of {n} tokens / {m} sequences does not fit graph size {size}")
    width = inputs.block_table.shape[1]
    if width > max_blocks:
        raise ValueError(f"block table of {width} blocks exceeds the graphs' {max_blocks}")
    ids = np.zeros(size, dtype=np.int64)
    ids[:n] = token_ids
    pos = np.zeros(size, dtype=np.int64)
    pos[:n] = positions
    slots = np.full(size, PADDING_SLOT, dtype=np.int64)
    slots[:n] = inputs.slot_mapping
    qsl = np.full(size + 1, n, dtype=np.int32)
    qsl[:m + 1] = inputs.query_start_loc
    lens = np.zeros(size, dtype=np.int32)
    lens[:m] = inputs.seq_lens
    table = np.zeros((size, width), dtype=np.int32)
    table[:m] = inputs.block_table
    return {"input_ids": ids, "positions": pos, "slot_mapping": slots,
            "query_start_loc": qsl, "seq_lens": lens, "block_table": table}


class CudaGraphRunner:
    """Captured forwards by size, their static inputs and outputs (module docstring)."""

    def __init__(self, capture_sizes: list[int], decode_only: bool, max_blocks: int,
                 block_size: int, device: torch.device,
                 graph_factory: Callable[[], Any] = TorchCudaGraph) -> None:
        self.capture_sizes = sorted(capture_sizes)
        self.decode_only = decode_only
        """FULL_DECODE_ONLY: replay only steps whose sequences each have one new token."""
        self.max_blocks = max_blocks
        self.block_size = block_size
        self.device = device
        self.graph_factory = graph_factory
        self.buffers = StaticBuffers.allocate(max(self.capture_sizes), max_blocks, device)
        self.staging = HostStaging(self.buffers, pin=device.type == "cuda")
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0
        """Steps served by a graph (what tests and the log count)."""

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1]

    def size_for(self, inputs: TritonInputs) -> Optional[int]:
        """The captured size that serves this step, or None (run it eagerly)."""
        n = inputs.num_tokens
        if not self.graphs or n == 0 or n > self.max_size:
            return None
        if self.decode_only and n != inputs.num_seqs:
            return None
        if inputs.block_table.shape[1] > self.max_blocks:
            return None
        i = int(np.searchsorted(self.capture_sizes, n))
        size = self.capture_sizes[i]
        return size if size in self.graphs else None

    def step_inputs(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The token ids and positions of a step this runner replays: views of the
        static buffers, which hold the step's values from its replay on."""
        return self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens]

    def capture_all(self, forward: ForwardFn, progress: bool = True) -> float:
        """Capture every size, largest first into one pool; returns the seconds taken."""
        from tqdm import tqdm
        start = time.perf_counter()
        pool = None
        sizes = sorted(self.capture_sizes, reverse=True)
        for size in tqdm(sizes, desc="Capturing CUDA graphs", disable=not progress):
            pool = self.capture(size, forward, pool)
        return time.perf_counter() - start

    def capture(self, size: int, forward: ForwardFn, pool: Any = None) -> Any:
        """Capture graph `size` on the static buffers, all rows padding (nothing read
        or written): one eager run first, so kernels are compiled and workspaces exist
        before capture. Returns the memory pool for the next capture."""
        self._reset_padding(size)
        md = self.buffers.metadata(size, self.block_size)
        ids, pos = self.buffers.input_ids[:size], self.buffers.positions[:size]
        forward(ids, pos, md)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        graph = self.graph_factory()
        self.outputs[size] = graph.capture(lambda: forward(ids, pos, md), pool)
        self.graphs[size] = graph
        return graph.pool() if hasattr(graph, "pool") else pool

    def _reset_padding(self, size: int) -> None:
        b = self.buffers
        b.input_ids[:size].zero_()
        b.positions[:size].zero_()
        b.slot_mapping[:size].fill_(PADDING_SLOT)
        b.query_start_loc[:size + 1].zero_()
        b.seq_lens[:size].zero_()

    def replay(self, size: int, inputs: TritonInputs, token_ids: np.ndarray,
               positions: np.ndarray) -> torch.Tensor:
        """Hidden states [n, hidden] of the step (a view of graph `size`'s output,
        valid until the next replay)."""
        host = padded_host_inputs(inputs, token_ids, positions, size, self.max_blocks)
        self.staging.upload(host, self.buffers, size)
        self.graphs[size].replay()
        self.replays += 1
        return self.outputs[size][:inputs.num_tokens]

    def drop(self) -> None:
        """Forget every graph (their KV cache or weights are about to be replaced)."""
        self.graphs.clear()
        self.outputs.clear()


class HostStaging:
    """Pinned host copies of the static buffers, allocated once: a replay writes the
    step's values there and copies them to the buffers asynchronously.

    Pinning a fresh tensor per array and step cost more host time than the copies
    themselves (profiled on an H200: ~0.3 ms a step at batch 1, while the GPU idled).
    The memory is reused, so a step first waits for the previous step's copies to
    have left it (an event; they have long finished unless the host ran ahead).
    """

    def __init__(self, buffers: StaticBuffers, pin: bool) -> None:
        self.pin = pin
        self.host = {name: torch.empty(getattr(buffers, name).numel(),
                                       dtype=getattr(buffers, name).dtype, pin_memory=pin)
                     for name in _BUFFER_NAMES}
        self._copied = torch.cuda.Event() if pin else None
        """Recorded after each upload's copies (waiting on it before any is recorded
        returns at once)."""

    def upload(self, values: dict[str, np.ndarray], buffers: StaticBuffers,
               size: int) -> None:
        """Copy `values` (padded_host_inputs of graph `size`) into the buffers."""
        if self._copied is not None:
            self._copied.synchronize()
        for name, array in values.items():
            staged = self.host[name][:array.size].view(array.shape)
            staged.copy_(torch.from_numpy(array))
            target = getattr(buffers, name)
            target = (target[:size, :array.shape[1]] if name == "block_table"
                      else target[:array.shape[0]])
            target.copy_(staged, non_blocking=self.pin)
        if self._copied is not None:
            self._copied.record()


_BUFFER_NAMES = ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens",
                 "block_table")
