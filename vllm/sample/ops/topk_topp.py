"""Truncation of the distribution: min-p, top-k and top-p (nucleus).

Each sets the logits of dropped tokens to -inf, in place, and never drops the most
likely token; rows whose knob is off (top_k 0, top_p 1, min_p 0) are left untouched.
Tokens tied with the last kept one are kept too.

A full sort of the vocabulary for top-p costs far more than the rest of the sampler
on CPU, yet nuclei are usually small:
- top-k alone thresholds each row at its k-th largest logit (`torch.topk` of the
  batch's largest k, no sort);
- top-k with top-p, when every row has top-k on, sorts only the batch's largest k
  logits of each row (`topk` returns them in order): the nucleus lies inside them;
- top-p where some row has top-k off first looks at the top `TOP_P_WINDOW` logits of
  each row and sorts the whole row only when its nucleus reaches past them. Which
  rows need the sort is data-dependent (a host sync on a GPU), so with
  `avoid_host_syncs` every row is sorted instead (same cut). A sort-free exact
  threshold search was not adopted: bisecting on the probability mass needs about
  as many passes over the row as there are float32 bits to be exact on ties.
The caller passes the batch's largest k and whether some row has top-k off from
host-side metadata; when not given they are read from `top_k` (a host sync).
"""
from __future__ import annotations

from typing import Optional

import torch

TOP_P_WINDOW = 256
"""Logits per row examined before falling back to a full sort for top-p."""


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: Optional[torch.Tensor],
                      top_p: Optional[torch.Tensor], max_k: Optional[int] = None,
                      any_k_off: Optional[bool] = None,
                      avoid_host_syncs: bool = False) -> torch.Tensor:
    """Keep the top_k most likely tokens, then the smallest set reaching mass top_p.

    top_p is measured on the distribution left after top_k, as in vLLM: a token is
    kept while the mass of the tokens more likely than it is below top_p. `max_k`
    (largest cutting top_k, 0 if none) and `any_k_off` come from host metadata when
    known (see the module doc).
    """
    if top_p is None:
        return logits if top_k is None else _apply_top_k_only(logits, top_k, max_k)
    vocab_size = logits.shape[-1]
    if top_k is None:
        k = torch.full_like(top_p, vocab_size, dtype=torch.int64)
        any_k_off = True
    else:
        k = torch.where((top_k <= 0) | (top_k >= vocab_size),
                        torch.full_like(top_k, vocab_size), top_k)
    if any_k_off is None:
        any_k_off = bool((k >= vocab_size).any())
    if not any_k_off:
        max_k = int(k.max()) if max_k is None else max(1, max_k)
        # Every row's cut lies in its top max_k logits; the whole-row normalizer is
        # never selected (k <= width in every row).
        top_values = logits.topk(max_k, dim=-1).values
        threshold, _ = _threshold(top_values, k, top_p, top_values[:, :1], vocab_size)
    elif avoid_host_syncs:
        return apply_top_k_top_p_sorted(logits, k, top_p)
    else:
        threshold = _windowed_threshold(logits, k, top_p, vocab_size)
    return logits.masked_fill_(logits < threshold, float("-inf"))


def _windowed_threshold(logits: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor,
                        vocab_size: int) -> torch.Tensor:
    """Thresholds from each row's top `TOP_P_WINDOW` logits, fully sorting only the
    rows whose cut lies past them (some row has top-k off: the normalizer of such a
    row is its whole row's)."""
    window = min(TOP_P_WINDOW, vocab_size)
    top_values = logits.topk(window, dim=-1).values
    full_lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    threshold, resolved = _threshold(top_values, k, top_p, full_lse, vocab_size)
    if window < vocab_size and not bool(resolved.all()):
        rows = (~resolved).nonzero().squeeze(1)
        sorted_values = logits[rows].sort(dim=-1, descending=True).values
        threshold[rows] = _threshold(sorted_values, k[rows], top_p[rows], full_lse[rows],
                                     vocab_size)[0]
    return threshold


def apply_top_k_top_p_sorted(logits: torch.Tensor, top_k: torch.Tensor,
                             top_p: torch.Tensor) -> torch.Tensor:
    """The cut of `apply_top_k_top_p` in static shapes (HPU graphs): every row fully
    sorted, no host sync, no data-dependent branch. `top_k` (0: off) and `top_p`
    (1: off) are [N] tensors for every row."""
    vocab_size = logits.shape[-1]
    k = torch.where((top_k <= 0) | (top_k >= vocab_size), torch.full_like(top_k, vocab_size),
                    top_k)
    values = logits.sort(dim=-1, descending=True).values
    # The window is the whole row, so every k lies in it: full_lse is never selected.
    threshold, _ = _threshold(values, k, top_p, values[:, :1], vocab_size)
    return logits.masked_fill_(logits < threshold, float("-inf"))


def _threshold(values: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor,
               full_lse: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest kept logit per row, from each row's top-W logits in descending order.

    `k` is vocab_size where top-k is off. Returns (threshold [M, 1], resolved [M]); a
    row is resolved when its top W logits decide the cut: top_k <= W, or top-k off and
    either top_p = 1 (nothing to cut) or the top W hold at least top_p of the mass.
    """
    width = values.shape[1]
    in_k = torch.arange(width, device=values.device) < k.unsqueeze(1)
    k_in_window = k <= width
    values_k = values.masked_fill(~in_k, float("-inf"))
    # Normalize over the top-k when they all lie in the window, else the whole row.
    lse = torch.where(k_in_window.unsqueeze(1),
                      torch.logsumexp(values_k, dim=-1, keepdim=True), full_lse)
    probs = (values_k - lse).exp()
    cumulative = probs.cumsum(dim=-1)
    mass_before = cumulative - probs
    no_top_p = top_p >= 1.0
    keep = in_k & ((mass_before < top_p.unsqueeze(1)) | no_top_p.unsqueeze(1))
    num_kept = keep.sum(dim=-1).clamp_min(1)  # a prefix: mass_before never decreases
    threshold = values.gather(1, (num_kept - 1).unsqueeze(1))
    uncut = no_top_p & ~k_in_window  # neither knob cuts inside this row
    threshold = threshold.masked_fill(uncut.unsqueeze(1), float("-inf"))
    k_off = k >= vocab_size
    resolved = k_in_window | (k_off & (no_top_p | (cumulative[:, -1] >= top_p)))
    return threshold, resolved


def _apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor,
                      max_k: Optional[int] = None) -> torch.Tensor:
    """top-k without a sort: threshold each row at its k-th largest logit (`max_k`:
    the largest cutting k, from host metadata; read from `top_k` when None)."""
    vocab_size = logits.shape[-1]
    off = (top_k <= 0) | (top_k >= vocab_size)
    k = top_k.masked_fill(off, 1)
    max_k = int(k.max()) if max_k is None else max(1, max_k)
    top_values = logits.topk(max_k, dim=-1).values
    kth = top_values.gather(1, (k - 1).unsqueeze(1))
    kth.masked_fill_(off.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))
