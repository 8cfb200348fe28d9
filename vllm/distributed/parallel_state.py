"""Tensor- and pipeline-parallel process groups of this worker.

Rank layout (as in vLLM): tensor parallel is the fastest-moving dimension, so the
global rank of a worker is ``pp_rank * tp_size + tp_rank``. Tensor-parallel groups
are consecutive ranks; pipeline groups take one rank of each stage with the same
``tp_rank`` (each TP rank of stage i talks only to the same TP rank of stage i+1).

Lifetime: a worker calls `init_distributed_environment(...)` then
`initialize_model_parallel(tp, pp)` once, before building the model; it calls
`destroy_model_parallel()` (and `destroy_distributed_environment()`) on shutdown.
When nothing was initialized, or when the world has one process, every group has
world size 1 and no `torch.distributed` call is ever made: single-process runs and
unit tests need no process group and no port.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass
class GroupCoordinator:
    """One process group seen from this process: its members and collectives.

    `device_group` carries tensors with the platform's backend (gloo, hccl, nccl);
    `cpu_group` (gloo) carries small pickled metadata, e.g. the shapes sent ahead of
    a pipeline-parallel tensor dict. Both are None for a single-rank group.
    """
    ranks: list[int]
    """Global ranks of the members, in group order."""
    rank: int
    """Global rank of this process."""
    device_group: Optional[Any] = None
    cpu_group: Optional[Any] = None
    name: str = field(default="")
    before_collective: Optional[Callable[[], None]] = None
    """Called before every device collective: Gaudi's lazy mode must cut the graph
    (`mark_step`) so the tensors a collective reads exist (see `HPUWorker`)."""

    def _prepare(self) -> None:
        if self.before_collective is not None:
            self.before_collective()

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def is_first_rank(self) -> bool:
        return self.rank == self.ranks[0]

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.ranks[-1]

    @property
    def next_rank(self) -> int:
        """Global rank of the next member (wrapping around)."""
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        """Global rank of the previous member (wrapping around)."""
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the group, in place; returns `x`."""
        if self.world_size == 1:
            return x
        self._prepare()
        dist.all_reduce(x, group=self.device_group)
        return x

    def all_reduce_int(self, value: int, op: str = "sum") -> int:
        """`value` reduced over the group ("sum", "min" or "max"), on the CPU group:
        host-side numbers the ranks must agree on (e.g. a memory budget)."""
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}.")
        if self.world_size == 1:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=ops[op], group=self.cpu_group)
        return int(t.item())

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every member's `x` along `dim`, in group order."""
        if self.world_size == 1:
            return x
        self._prepare()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Send a picklable object from member `src` (index in group) to all members."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def send_tensor_dict(self, tensors: dict[str, torch.Tensor],
                         dst: Optional[int] = None) -> None:
        """Send named tensors to member `dst` (index in group; default: the next one).

        The names, dtypes and shapes go first over the CPU group, so the receiver
        can allocate buffers without knowing the batch size in advance.
        """
        if self.world_size == 1:
            raise RuntimeError(f"send_tensor_dict needs a group of 2 or more ranks "
                               f"({self.name or 'group'} has 1).")
        dst_rank = self.next_rank if dst is None else self.ranks[dst]
        self._prepare()
        meta = [(k, t.dtype, tuple(t.shape)) for k, t in tensors.items()]
        dist.send_object_list([meta], dst=dst_rank, group=self.cpu_group)
        for _, t in tensors.items():
            dist.send(t.contiguous(), dst=dst_rank, group=self.device_group)

    def recv_tensor_dict(self, src: Optional[int] = None,
                         device: Optional[torch.device | str] = None) -> dict[str, torch.Tensor]:
        """Receive what `send_tensor_dict` sent from member `src` (default: the previous)."""
        if self.world_size == 1:
            raise RuntimeError(f"recv_tensor_dict needs a group of 2 or more ranks "
                               f"({self.name or 'group'} has 1).")
        src_rank = self.prev_rank if src is None else self.ranks[src]
        self._prepare()
        box: list[Any] = [None]
        dist.recv_object_list(box, src=src_rank, group=self.cpu_group)
        out: dict[str, torch.Tensor] = {}
        for name, dtype, shape in box[0]:
            t = torch.empty(shape, dtype=dtype, device=device or "cpu")
            dist.recv(t, src=src_rank, group=self.device_group)
            out[name] = t
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)


_TP: Optional[GroupCoordinator] = None
_PP: Optional[GroupCoordinator] = None
_CREATED_GROUPS: list[Any] = []
"""Every process group this module created, for `destroy_model_parallel`."""
_OWNS_WORLD = False
"""True when `init_distributed_environment` created the default process group."""


def _single(name: str) -> GroupCoordinator:
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return GroupCoordinator(ranks=[rank], rank=rank, name=name)


def init_distributed_environment(world_size: int = 1, rank: int = 0,
                                 distributed_init_method: str = "env://",
                                 local_rank: int = 0, backend: str = "gloo") -> None:
    """Join the default process group (once per process).

    A world of one process creates no process group at all. `local_rank` selects the
    device on multi-device nodes; the worker sets its device itself, so it is only
    validated here.
    """
    global _OWNS_WORLD
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, "
                         f"world_size={world_size}.")
    if local_rank < 0:
        raise ValueError(f"local_rank must be >= 0, got {local_rank}.")
    if world_size == 1 or dist.is_initialized():
        if dist.is_initialized() and dist.get_world_size() != world_size:
            raise ValueError(f"torch.distributed is already initialized with world size "
                             f"{dist.get_world_size()}, not {world_size}.")
        return
    logger.debug("init_process_group(backend=%s, rank=%d/%d, init=%s)", backend, rank,
                 world_size, distributed_init_method)
    dist.init_process_group(backend=backend, init_method=distributed_init_method,
                            world_size=world_size, rank=rank)
    _OWNS_WORLD = True


def initialize_model_parallel(tensor_model_parallel_size: int = 1,
                              pipeline_model_parallel_size: int = 1,
                              before_collective: Optional[Callable[[], None]] = None) -> None:
    """Create the TP and PP groups; every rank must call this with the same sizes.

    `before_collective` (e.g. the HPU's `mark_step` in lazy mode) runs before each
    device collective of both groups."""
    global _TP, _PP
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    if tp < 1 or pp < 1:
        raise ValueError(f"tensor and pipeline parallel sizes must be >= 1, got tp={tp}, "
                         f"pp={pp}.")
    world = dist.get_world_size() if dist.is_initialized() else 1
    if tp * pp != world:
        raise ValueError(f"tensor_parallel_size ({tp}) x pipeline_parallel_size ({pp}) must "
                         f"equal the world size ({world}).")
    if _TP is not None:
        raise RuntimeError("model parallel groups are already initialized; call "
                           "destroy_model_parallel() first.")
    if world == 1:
        _TP, _PP = _single("tp"), _single("pp")
    else:
        rank = dist.get_rank()
        backend = dist.get_backend()
        tp_groups = [[p * tp + t for t in range(tp)] for p in range(pp)]
        pp_groups = [[p * tp + t for p in range(pp)] for t in range(tp)]
        _TP = _make_group("tp", tp_groups, rank, backend)
        _PP = _make_group("pp", pp_groups, rank, backend)
        logger.debug("rank %d: tp group %s, pp group %s", rank, _TP.ranks, _PP.ranks)
    _TP.before_collective = _PP.before_collective = before_collective


def _make_group(name: str, all_ranks: list[list[int]], rank: int,
                backend: str) -> GroupCoordinator:
    """Create every group of one kind (all processes must create all of them)."""
    mine: Optional[GroupCoordinator] = None
    for ranks in all_ranks:
        device_group = cpu_group = None
        if len(ranks) > 1:
            device_group = dist.new_group(ranks, backend=backend)
            cpu_group = (device_group if backend == "gloo" else
                         dist.new_group(ranks, backend="gloo"))
            _CREATED_GROUPS.extend({id(g): g for g in (device_group, cpu_group)}.values())
        if rank in ranks:
            mine = GroupCoordinator(ranks, rank, device_group, cpu_group, name)
    assert mine is not None, "every rank belongs to one group of each kind"
    return mine


@contextlib.contextmanager
def single_rank_groups() -> Iterator[None]:
    """Within the block this rank is a world of its own (TP and PP size 1): a model
    built or run here is whole on this rank and its collectives are no-ops. What a
    speculative-decoding draft model (TP 1) beside a tensor-parallel target uses."""
    global _TP, _PP
    saved = (_TP, _PP)
    _TP, _PP = _single("tp"), _single("pp")
    try:
        yield
    finally:
        _TP, _PP = saved


def model_parallel_is_initialized() -> bool:
    return _TP is not None and _PP is not None


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group (world size 1 when not initialized)."""
    return _TP if _TP is not None else _single("tp")


def get_pp_group() -> GroupCoordinator:
    """This rank's pipeline-parallel group (world size 1 when not initialized)."""
    return _PP if _PP is not None else _single("pp")


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_pipeline_model_parallel_world_size() -> int:
    return get_pp_group().world_size


def get_pipeline_model_parallel_rank() -> int:
    return get_pp_group().rank_in_group


def destroy_model_parallel() -> None:
    """Forget the TP/PP groups and release the process groups created for them."""
    global _TP, _PP
    _TP = _PP = None
    while _CREATED_GROUPS:
        group = _CREATED_GROUPS.pop()
        if dist.is_initialized():
            dist.destroy_process_group(group)


def destroy_distributed_environment() -> None:
    """Leave the default process group if `init_distributed_environment` created it."""
    global _OWNS_WORLD
    destroy_model_parallel()
    if _OWNS_WORLD and dist.is_initialized():
        dist.destroy_process_group()
    _OWNS_WORLD = False
