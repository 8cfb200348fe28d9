"""State slots of state-space layers (vllm/kv_cache_spec.py `MambaSpec`).

A Mamba layer keeps, per running request, a fixed-size conv state and SSM state
instead of KV blocks. Each state layer has two tensors of `num_slots + 1` slots,
`[num_slots + 1, *conv_shape]` and `[num_slots + 1, *ssm_shape]`; the last slot is the
pad slot, which padding rows of a fixed-shape batch (HPU) read and write so that their
writes never touch a request's state. `num_slots` is what the KV cache budget pays for,
at most `max_num_seqs` (`KVCacheConfig.state_slots`; the engine caps max_num_seqs to it,
so the scheduler never runs more requests), and a request holds its slot from its first
step until it finishes or is preempted (`SchedulerOutput.preempted_req_ids`). A slot is zeroed when
it is given, and a pass reads a request's state only when the request has computed
tokens before this step (`has_initial`), so a preempted request, which recomputes
from scratch, starts from a zero state.

Layers find this pass's `StateMetadata` through `get_state_metadata()` (set by the
runner around the forward, like the attention metadata); without one (a model called
outside a runner) a Mamba layer treats the input as one sequence from a zero state.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import torch

from vllm.kv_cache_spec import MambaSpec


@dataclass
class StateMetadata:
    """Where each request of a pass finds its state, and which rows are its tokens.

    Flat layout (CPU, CUDA): request i owns rows `row_offsets[i]` .. + `num_tokens[i]`.
    Padded layout (HPU, `padded=True`): the pass's rows are `[len(slots), seq_len]`,
    request i's tokens first in its row, `num_tokens[i]` of them (0 for padding rows,
    whose slot is the pad slot)."""
    slots: torch.Tensor
    """[num_seqs] int64: each request's state slot."""
    has_initial: torch.Tensor
    """[num_seqs] bool: whether the request computed tokens before this pass."""
    row_offsets: list[int]
    num_tokens: list[int]
    states: dict[int, tuple[torch.Tensor, torch.Tensor]]
    """Layer index -> (conv state, SSM state) tensors (every slot)."""
    padded: bool = False
    seq_lens: Optional[torch.Tensor] = None
    """Padded layout: [num_seqs] int64 device copy of `num_tokens`."""
    has_initial_list: list[bool] = field(default_factory=list)


class StateCache:
    """The state tensors of this rank's state layers and the request -> slot map."""

    def __init__(self, specs: dict[int, MambaSpec], num_slots: int,
                 device: torch.device) -> None:
        self.num_slots = num_slots
        self.pad_slot = num_slots
        self.states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            i: (torch.zeros((num_slots + 1, *s.conv_shape), dtype=s.conv_dtype, device=device),
                torch.zeros((num_slots + 1, *s.ssm_shape), dtype=s.ssm_dtype, device=device))
            for i, s in specs.items()}
        self.slot_of: dict[str, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.states.values() for t in pair)

    def free(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            slot = self.slot_of.pop(req_id, None)
            if slot is not None:
                self._free.append(slot)

    def assign(self, req_id: str) -> int:
        """The request's slot, a fresh zeroed one if it holds none."""
        slot = self.slot_of.get(req_id)
        if slot is not None:
            return slot
        if not self._free:
            raise RuntimeError(f"no free state slot for request {req_id!r}: more than "
                               f"{self.num_slots} requests (max_num_seqs) hold one")
        slot = self._free.pop()
        self.slot_of[req_id] = slot
        self.reset(slot)
        return slot

    def reset(self, slot: int) -> None:
        for conv, ssm in self.states.values():
            conv[slot].zero_()
            ssm[slot].zero_()

    def update(self, finished: Iterable[str], preempted: Iterable[str],
               new: Iterable[str], resumed: Iterable[str]) -> None:
        """Follow one scheduler step: free the slots of finished and preempted
        requests, then give slots to new and resumed ones (zeroed)."""
        self.free(finished)
        self.free(preempted)
        for req_id in resumed:
            self.free([req_id])  # recomputes from scratch: a zeroed slot
        for req_id in list(new) + list(resumed):
            self.assign(req_id)

    def flat_metadata(self, req_ids: list[str], row_offsets: list[int],
                      num_tokens: list[int], num_computed: list[int],
                      device: torch.device) -> StateMetadata:
        slots = [self.assign(r) for r in req_ids]
        has_initial = [n > 0 for n in num_computed]
        return StateMetadata(
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            has_initial=torch.tensor(has_initial, dtype=torch.bool, device=device),
            row_offsets=list(row_offsets), num_tokens=list(num_tokens), states=self.states,
            has_initial_list=has_initial)

    def padded_metadata(self, req_ids: list[Optional[str]], num_tokens: list[int],
                        num_computed: list[int], device: torch.device) -> StateMetadata:
        """Fixed-shape layout: one row of the [rows, seq_len] pass per entry of
        `req_ids` (None: a padding row, which gets the pad slot and 0 tokens)."""
        slots = [self.pad_slot if r is None else self.assign(r) for r in req_ids]
        has_initial = [r is not None and c > 0 for r, c in zip(req_ids, num_computed)]
        return StateMetadata(
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            has_initial=torch.tensor(has_initial, dtype=torch.bool, device=device),
            row_offsets=[], num_tokens=list(num_tokens), states=self.states, padded=True,
            seq_lens=torch.tensor(num_tokens, dtype=torch.long, device=device),
            has_initial_list=has_initial)


def state_share_per_block(config, owned: Iterable[int], max_model_len: int,
                          block_size: int) -> int:
    """Bytes block sizing charges each block for the state slots: one request's state
    spread over the blocks of a full-length request."""
    state = config.state_bytes_per_request(owned)
    if not state:
        return 0
    blocks = -(-max_model_len // block_size)
    return -(-state // blocks)


_state_metadata: Optional[StateMetadata] = None


def get_state_metadata() -> Optional[StateMetadata]:
    return _state_metadata


@contextmanager
def set_state_metadata(metadata: Optional[StateMetadata]) -> Iterator[None]:
    global _state_metadata
    prev = _state_metadata
    _state_metadata = metadata
    try:
        yield
    finally:
        _state_metadata = prev
