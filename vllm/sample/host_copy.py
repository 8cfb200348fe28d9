"""Host <-> device copies of the sampler's small tensors, without stalling the GPU.

On CUDA a blocking copy waits for every kernel queued before it: a host-built index
copied with `.to(device)` after the forward pass is queued stalls the host until the
model has run, and each `.tolist()` of a device tensor does the same. The sampler
therefore sends host values through `host_to_device` (pinned memory and a
non-blocking copy, which the stream orders before the kernels that read it), and
the step reads its results back with one `device_to_host` call: a single
synchronisation per step. On CPU both are plain conversions.
"""
from __future__ import annotations

from itertools import chain
from typing import Sequence, Union

import torch

HostValues = Union[Sequence, torch.Tensor]


def host_to_device(values: HostValues, dtype: torch.dtype,
                   device: torch.device | str) -> torch.Tensor:
    """`values` (a host list or CPU tensor) as a tensor on `device`; asynchronous on
    CUDA (the pinned staging buffer is kept alive by torch's host allocator until the
    copy has run)."""
    device = torch.device(device)
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    host = host.to(dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def device_to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """CPU copies of `tensors` after one wait: every device tensor is copied into
    pinned memory asynchronously, then the stream is synchronised once."""
    cuda = [t for t in tensors if t.is_cuda]
    if not cuda:
        return list(tensors)
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            if t.is_cuda else t for t in tensors]
    torch.cuda.current_stream(cuda[0].device).synchronize()
    return host


def flat_tokens(seqs: Sequence[Sequence[int]], vocab_size: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) of every in-vocabulary token of `seqs`, as two flat tensors
    on `device` (what the per-row token lists of a knob become)."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    tokens = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.int64)
    row_ids = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
    keep = (tokens >= 0) & (tokens < vocab_size)
    return (host_to_device(row_ids[keep], torch.int64, device),
            host_to_device(tokens[keep], torch.int64, device))
