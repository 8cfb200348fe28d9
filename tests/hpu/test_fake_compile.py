"""The fake HPU's dynamo backend: eager results outside warmup, traced-shape zeros inside."""
from __future__ import annotations

import torch
import torch._dynamo
from torch import nn

from vllm.hpu.habana import fake_compile
from vllm.hpu.habana.fake_compile import fake_hpu_backend, output_specs, shape_only_regions


class Block(nn.Module):
    """A region like the decoder's: norm-ish math, a projection, a pass-through output."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 12)

    def forward(self, x: torch.Tensor, residual: torch.Tensor):
        residual = x + residual
        h = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.proj(h).view(x.shape[0], 3, 4), residual, x


class WritesState(nn.Module):
    """Updates a buffer and writes into its input: state a skipped graph would lose."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("total", torch.zeros(8))

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        out = self.proj(x)
        self.total.add_(out.sum(0))
        cache[: x.shape[0]].copy_(out)
        return out


def _compiled(module: nn.Module) -> nn.Module:
    torch._dynamo.reset()
    module.compile(backend=fake_hpu_backend, dynamic=False)
    return module


@torch.inference_mode()
def test_regions_compute_outside_and_return_traced_zeros_inside_warmup():
    torch.manual_seed(0)
    eager = Block()
    region = _compiled(Block())
    region.load_state_dict(eager.state_dict())
    x, r = torch.randn(5, 8), torch.randn(5, 8)
    for got, want in zip(region(x, r), eager(x, r)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    y = torch.randn(7, 8)  # a new shape, first seen inside the context: traced there
    with shape_only_regions():
        out, res, passthrough = region(y, y)
        assert out.shape == (7, 3, 4) and res.shape == (7, 8)
        assert out.dtype == torch.float32 and out.stride() == (12, 4, 1)
        assert not out.any() and not res.any()  # the arithmetic was skipped
        assert passthrough is y  # an input returned as is stays that input
    # Serving after the context: the shape traced inside computes for real.
    for got, want in zip(region(y, y), eager(y, y)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@torch.inference_mode()
def test_graphs_writing_inputs_or_buffers_always_compute():
    torch.manual_seed(0)
    eager = WritesState()
    region = _compiled(WritesState())
    region.load_state_dict(eager.state_dict())
    x = torch.randn(3, 8)
    cache, want_cache = torch.zeros(4, 8), torch.zeros(4, 8)
    with shape_only_regions():
        torch.testing.assert_close(region(x, cache), eager(x, want_cache), rtol=0, atol=0)
    torch.testing.assert_close(cache, want_cache, rtol=0, atol=0)
    torch.testing.assert_close(region.total, eager.total, rtol=0, atol=0)


def test_output_specs_keep_traced_strides_and_refuse_writes_to_inputs():
    seen = []

    def spy(gm, example_inputs):
        seen.append(output_specs(gm))
        return gm.forward

    def pass_through(a):
        return a.t() * 2, a + 0, a

    def own_intermediate(a):  # in place, but on memory only the graph sees
        return torch.nn.functional.silu(a * 2).mul_(a)

    def view_of_input(a):
        return a.view(6)[:2].add_(1)

    def same_dtype_float(a):  # .float() of a float32 tensor is the tensor itself
        return a.float().mul_(3)

    torch._dynamo.reset()
    for fn in (pass_through, own_intermediate, view_of_input, same_dtype_float):
        torch.compile(fn, backend=spy, dynamic=False)(torch.ones(2, 3))
    (doubled, plus), (activation,), into_view, into_alias = seen
    assert (doubled.size, doubled.stride) == ((3, 2), (1, 3))  # traced, not contiguous
    assert (plus.size, plus.stride) == ((2, 3), (3, 1))
    assert activation.size == (2, 3)
    assert into_view is None and into_alias is None


def test_context_nests_and_restores():
    assert fake_compile._shape_only_depth == 0
    with shape_only_regions():
        with shape_only_regions():
            assert fake_compile._shape_only_depth == 2
        assert fake_compile._shape_only_depth == 1
    assert fake_compile._shape_only_depth == 0
