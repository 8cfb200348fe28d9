"""The bitmask ops against a per-token reference loop."""
from __future__ import annotations

import numpy as np
import torch

from vllm.sample.ops import bitmask as ops


def reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for i in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if not (int(bitmask[i, t // 32]) >> (t % 32)) & 1:
                out[i, t] = float("-inf")
    return out


def test_apply_token_bitmask_matches_reference():
    g = torch.Generator().manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word is partly padding
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 4), dtype=torch.int32, generator=g)
    logits = torch.randn(3, vocab, generator=g)
    expected = reference(logits, bitmask)
    out = ops.apply_token_bitmask_(logits.clone(), bitmask)
    assert torch.equal(out, expected)
    assert ops.unpack_bitmask(bitmask, vocab).sum() == torch.isfinite(expected).sum()


def test_grammar_bitmask_touches_only_constrained_rows():
    g = torch.Generator().manual_seed(1)
    vocab = 70
    grammar = torch.randint(-2**31, 2**31 - 1, (2, 3), dtype=torch.int32, generator=g)
    logits = torch.randn(4, vocab, generator=g)
    req_ids = ["free0", "b", "free1", "a"]
    ids = {"a": 0, "b": 1}
    for dtype in (torch.float32, torch.bfloat16):
        out = logits.to(dtype).clone()
        ops.apply_grammar_bitmask(out, req_ids, ids, grammar.numpy())
        assert torch.equal(out[0], logits.to(dtype)[0]) and torch.equal(out[2],
                                                                       logits.to(dtype)[2])
        assert torch.equal(out[3], reference(logits.to(dtype)[3:4], grammar[0:1])[0])
        assert torch.equal(out[1], reference(logits.to(dtype)[1:2], grammar[1:2])[0])
    untouched = logits.clone()
    ops.apply_grammar_bitmask(untouched, req_ids, {}, None)
    assert torch.equal(untouched, logits)


def test_rows_bitmask_pads_with_allow_all():
    grammar = np.array([[5, 0]], dtype=np.int32)
    rows = ops.rows_bitmask(["x", "c", ""], {"c": 0}, grammar, num_rows=4)
    assert rows.shape == (4, 2)
    assert rows[1].tolist() == [5, 0]
    assert (rows[[0, 2, 3]] == -1).all()
    assert ops.rows_bitmask(["x"], {}, grammar, num_rows=2) is None
    assert ops.rows_bitmask(["x"], {"x": 0}, None, num_rows=2) is None
