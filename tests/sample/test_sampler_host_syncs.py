"""The sampler never makes the host wait for the device, and its sort-free top-k /
top-p cut the same tokens as the former implementation.

There is no GPU here, so the test watches the Python-level operations that make a
CUDA host wait (reading a value: `.item()`, `.tolist()`, `bool()`, `int()`,
`.cpu()`; data-dependent shapes: `nonzero`, boolean-mask indexing, `unique`,
`repeat_interleave` without `output_size`; host-built tensors not sent through
`host_to_device`) while `Sampler.forward` runs on CPU tensors standing for device
ones, with the sync-free paths selected (`avoid_host_syncs=True`).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional

import pytest
import torch

from vllm.sample import host_copy, sampler as sampler_module
from vllm.sample.metadata import SamplingMetadata, SamplingRow, make_generator
from vllm.sample.ops import topk_topp
from vllm.sample.ops.topk_topp import _threshold, apply_top_k_top_p
from vllm.sample.sampler import Sampler
from vllm.sample.sampling_state import SamplingState, build_metadata
from vllm.sampling_params import SamplingParams

VOCAB = 600  # wider than TOP_P_WINDOW, so a nucleus can reach past the window

_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu",
          "numpy", "nonzero", "masked_select")


class HostSyncWatch:
    """Records every operation of the module doc while `active`."""

    def __init__(self) -> None:
        self.active = False
        self.syncs: list[str] = []

    @contextlib.contextmanager
    def watching(self) -> Iterator[list[str]]:
        self.active, self.syncs = True, []
        try:
            yield self.syncs
        finally:
            self.active = False

    def _hit(self, name: str) -> None:
        if self.active:
            self.active = False  # the check itself may touch tensors
            self.syncs.append(name)
            self.active = True

    def wrap_read(self, name: str, real):
        def wrapper(*args, **kwargs):
            self._hit(name)
            return real(*args, **kwargs)
        return wrapper

    def wrap_index(self, name: str, real):
        def wrapper(tensor, index, *rest):
            items = index if isinstance(index, tuple) else (index,)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items):
                self._hit(f"{name} with a boolean mask")
            return real(tensor, index, *rest)
        return wrapper

    def wrap_repeat_interleave(self, real):
        def wrapper(tensor, repeats=None, dim=None, *, output_size=None):
            if isinstance(repeats, torch.Tensor) and output_size is None:
                self._hit("repeat_interleave without output_size")
            return real(tensor, repeats, dim, output_size=output_size)
        return wrapper

    def wrap_tensor_factory(self, name: str, real):
        allowed = host_copy.host_to_device.__code__

        def wrapper(*args, **kwargs):
            if sys._getframe(1).f_code is not allowed:
                self._hit(f"{name} (a host tensor copied synchronously)")
            return real(*args, **kwargs)
        return wrapper


@pytest.fixture
def watch(monkeypatch) -> HostSyncWatch:
    w = HostSyncWatch()
    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, w.wrap_read(name, getattr(torch.Tensor, name)))
    for name in ("nonzero", "unique", "masked_select"):
        monkeypatch.setattr(torch, name, w.wrap_read(f"torch.{name}", getattr(torch, name)))
    monkeypatch.setattr(torch.Tensor, "__getitem__",
                        w.wrap_index("__getitem__", torch.Tensor.__getitem__))
    monkeypatch.setattr(torch.Tensor, "__setitem__",
                        w.wrap_index("__setitem__", torch.Tensor.__setitem__))
    monkeypatch.setattr(torch.Tensor, "repeat_interleave",
                        w.wrap_repeat_interleave(torch.Tensor.repeat_interleave))
    monkeypatch.setattr(torch, "repeat_interleave",
                        w.wrap_repeat_interleave(torch.repeat_interleave))
    for name in ("tensor", "as_tensor"):
        monkeypatch.setattr(torch, name, w.wrap_tensor_factory(name, getattr(torch, name)))
    return w


def _row(seed: Optional[int] = None, output=(5, 7, 5), **kw) -> SamplingRow:
    params = SamplingParams(seed=seed, **kw)
    gen = make_generator(seed) if seed is not None else None
    return SamplingRow(params, prompt_token_ids=(1, 2, 3, 700), output_token_ids=output,
                       generator=gen)


SCENARIOS = {
    "greedy": [dict(temperature=0.0), dict(temperature=0.0)],
    "temperature": [dict(temperature=0.7), dict(temperature=1.3)],
    "mixed greedy and random": [dict(temperature=0.0), dict(temperature=0.9)],
    "top-k": [dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_k=0),
              dict(temperature=0.8, top_k=40)],
    "top-p": [dict(temperature=1.0, top_p=0.9), dict(temperature=1.0, top_p=0.999),
              dict(temperature=1.0)],
    "top-k and top-p": [dict(temperature=1.0, top_k=50, top_p=0.8),
                        dict(temperature=1.0, top_k=3, top_p=1.0)],
    "top-k and top-p, a row without top-k": [dict(temperature=1.0, top_k=50, top_p=0.8),
                                             dict(temperature=1.0, top_p=0.999)],
    "min-p": [dict(temperature=1.0, min_p=0.1), dict(temperature=1.0)],
    "penalties": [dict(temperature=1.0, repetition_penalty=1.3),
                  dict(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.4),
                  dict(temperature=1.0)],
    "logit_bias": [dict(temperature=1.0, logit_bias={3: 5.0, 9: -2.0}),
                   dict(temperature=0.0, logit_bias={4: 100.0})],
    "allowed ids and min_tokens": [dict(temperature=1.0, allowed_token_ids=[3, 4, 9]),
                                   dict(temperature=1.0, min_tokens=10,
                                        stop_token_ids=[11])],
    "seeded": [dict(temperature=1.0, seed=3), dict(temperature=1.0, seed=4, top_k=7),
               dict(temperature=1.0)],
    "logprobs": [dict(temperature=1.0, logprobs=3), dict(temperature=0.0, logprobs=0)],
}


def _metadata(specs: list[dict]) -> SamplingMetadata:
    return build_metadata([_row(**spec) for spec in specs], VOCAB, "cpu")


def _flat_logits(rows: int) -> torch.Tensor:
    """Nearly flat rows: top-p nuclei reach past the top-p window."""
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 0.05


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_forward_makes_no_host_sync(watch, name):
    md = _metadata(SCENARIOS[name])
    logits = _flat_logits(md.num_rows)
    with watch.watching() as syncs:
        out = Sampler(avoid_host_syncs=True)(logits, md)
    assert syncs == []
    assert out.sampled_token_ids.shape == (md.num_rows,)


def test_watch_catches_the_former_windowed_top_p(watch):
    """The harness fails a sampler that waits: the CPU path's windowed top-p (a row
    without top-k, a nucleus past the window) reads which rows to sort."""
    md = _metadata(SCENARIOS["top-k and top-p, a row without top-k"])
    with watch.watching() as syncs:
        Sampler(avoid_host_syncs=False)(_flat_logits(md.num_rows), md)
    assert "__bool__" in syncs and "nonzero" in syncs


def test_watch_catches_each_kind_of_sync(watch):
    t = torch.arange(6)
    with watch.watching() as syncs:
        int(t.max())
        t.tolist()
        bool(t.any())
        t[t > 2]
        t.nonzero()
        t.repeat_interleave(torch.ones(6, dtype=torch.int64))
        torch.tensor([1, 2])
        host_copy.host_to_device([1, 2], torch.int64, "cpu")
    assert syncs == ["__int__", "tolist", "__bool__", "__getitem__ with a boolean mask",
                     "nonzero", "repeat_interleave without output_size",
                     "tensor (a host tensor copied synchronously)"]


def test_recording_tokens_reads_nothing_back(watch):
    """The penalty tables learn new seen tokens from their host set, not by reading
    the device counts."""
    rows = [_row(repetition_penalty=1.2), _row(frequency_penalty=0.3, output=())]
    state = SamplingState.from_rows(rows)
    state.metadata([0, 1], VOCAB, "cpu")  # allocates the tables
    with watch.watching() as syncs:
        state.record_tokens([0, 1, 1], [5, 42, 42])
    assert syncs == []
    tables = state.state_of("penalties").tables
    assert sorted(tables.seen[1].tokens().tolist()) == [1, 2, 3, 42]
    assert sorted(tables.seen[0].tokens().tolist()) == [1, 2, 3, 5, 7]
    assert tables.token_stats[1, 42].item() == 4 and tables.token_stats[0, 5].item() == 6


def test_output_is_read_back_in_one_copy(monkeypatch):
    calls = []
    real = sampler_module.device_to_host

    def counting(tensors):
        calls.append(len(tensors))
        return real(tensors)

    monkeypatch.setattr(sampler_module, "device_to_host", counting)
    md = _metadata(SCENARIOS["logprobs"])
    out = Sampler()(_flat_logits(md.num_rows), md)
    token_ids, lp = out.tolists()
    assert calls == [4]
    assert token_ids == out.sampled_token_ids.tolist()
    assert lp == out.logprobs_tensors.tolists()


# ------------------------------------------------ equivalence with the former cut
def former_top_k_top_p(logits: torch.Tensor, top_k: Optional[torch.Tensor],
                       top_p: Optional[torch.Tensor], window_size: int = 256) -> torch.Tensor:
    """The implementation before the sort-free paths, kept as the reference."""
    if top_p is None:
        if top_k is None:
            return logits
        vocab_size = logits.shape[-1]
        off = (top_k <= 0) | (top_k >= vocab_size)
        k = top_k.masked_fill(off, 1)
        top_values = logits.topk(int(k.max()), dim=-1).values
        kth = top_values.gather(1, (k - 1).unsqueeze(1))
        kth.masked_fill_(off.unsqueeze(1), float("-inf"))
        return logits.masked_fill_(logits < kth, float("-inf"))
    vocab_size = logits.shape[-1]
    if top_k is None:
        k = torch.full_like(top_p, vocab_size, dtype=torch.int64)
    else:
        k = torch.where((top_k <= 0) | (top_k >= vocab_size),
                        torch.full_like(top_k, vocab_size), top_k)
    window = min(window_size, vocab_size)
    top_values = logits.topk(window, dim=-1).values
    if bool((k >= vocab_size).any()):
        full_lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    else:
        full_lse = torch.zeros_like(top_values[:, :1])
    threshold, resolved = _threshold(top_values, k, top_p, full_lse, vocab_size)
    if window < vocab_size and not bool(resolved.all()):
        rows = (~resolved).nonzero().squeeze(1)
        sorted_values = logits[rows].sort(dim=-1, descending=True).values
        threshold[rows] = _threshold(sorted_values, k[rows], top_p[rows], full_lse[rows],
                                     vocab_size)[0]
    return logits.masked_fill_(logits < threshold, float("-inf"))


def _random_case(seed: int, rows: int, vocab: int, ties: bool):
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: ties at every cut
        logits = torch.randint(0, 6, (rows, vocab), generator=g).float() * 0.5
    else:
        scale = torch.where(torch.arange(rows) % 2 == 0, 4.0, 0.05).unsqueeze(1)
        logits = torch.randn(rows, vocab, generator=g) * scale
    ks = torch.tensor([[0, 1, 2, 7, 30, 300, vocab, -1][(i + seed) % 8] for i in range(rows)])
    ps = torch.tensor([[1.0, 0.5, 0.9, 0.99, 0.2][(i + 2 * seed) % 5] for i in range(rows)])
    return logits, ks, ps


def _host_facts(ks: torch.Tensor, vocab: int) -> tuple[int, bool]:
    cuts = [k for k in ks.tolist() if 0 < k < vocab]
    return max(cuts, default=0), len(cuts) < ks.numel()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("knobs", ["k", "p", "kp", "kp all on"])
@pytest.mark.parametrize("avoid_host_syncs", [False, True])
@pytest.mark.parametrize("host_facts", [False, True])
def test_cut_matches_former_implementation(seed, ties, knobs, avoid_host_syncs, host_facts):
    rows, vocab = 24, VOCAB
    logits, ks, ps = _random_case(seed, rows, vocab, ties)
    if knobs == "kp all on":
        ks = torch.where((ks <= 0) | (ks >= vocab), torch.full_like(ks, 9), ks)
    top_k = None if knobs == "p" else ks
    top_p = None if knobs == "k" else ps
    expected = former_top_k_top_p(logits.clone(), top_k, top_p)
    max_k, any_off = (None, None)
    if host_facts and top_k is not None:
        max_k, any_off = _host_facts(top_k, vocab)
    got = apply_top_k_top_p(logits.clone(), top_k, top_p, max_k, any_off, avoid_host_syncs)
    assert torch.equal(got.isinf(), expected.isinf())
    assert torch.equal(got, expected)


def test_host_facts_come_from_the_metadata():
    md = _metadata([dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_k=40),
                    dict(temperature=0.0)])
    assert (md.top_k_max, md.top_k_any_off) == (40, True)
    md = _metadata([dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_k=40)])
    assert (md.top_k_max, md.top_k_any_off) == (40, False)
    md = _metadata([dict(temperature=1.0, top_k=5000), dict(temperature=1.0, top_k=4)])
    assert (md.top_k_max, md.top_k_any_off) == (4, True)  # k >= vocab does not cut


def test_top_k_and_top_p_sort_only_the_kept_window(monkeypatch):
    """With top-k on in every row, nothing sorts the vocabulary: topk takes the
    batch's largest k only."""
    def no_sort(*args, **kwargs):
        raise AssertionError("full sort")

    widths = []
    real_topk = torch.Tensor.topk

    def topk(t, k, *args, **kwargs):
        widths.append(k)
        return real_topk(t, k, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    monkeypatch.setattr(torch.Tensor, "topk", topk)
    logits, _, ps = _random_case(0, 8, VOCAB, ties=False)
    ks = torch.tensor([3, 9, 17, 2, 5, 9, 1, 4])
    apply_top_k_top_p(logits, ks, ps, 17, False, avoid_host_syncs=True)
    assert widths == [17]
    assert topk_topp.TOP_P_WINDOW > 17  # a window narrower than the former one
