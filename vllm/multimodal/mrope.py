"""M-RoPE positions (Qwen2-VL family): three position rows (t, h, w) per token.

A prompt's positions are computed once per request from its placeholder spans and
each image's grid: text tokens count up as usual (three equal rows); an image's
tokens carry (t, h, w) grid coordinates (after the spatial merge) offset by the
position the image starts at, and the text after the image continues from that
start + max(grid h, grid w), so an image takes fewer positions than tokens. Every
token past the prompt (decode, drafts) is at its index + `delta`, the same on all
three rows: `delta` = (last prompt position + 1) - prompt length.

The runner keeps the positions and delta in each request's state and, per pass,
writes the rows of the requests with images into a [3, rows] positions tensor
(`pass_mrope_positions`); chunked prefill and a resumed (preempted) request read
the same precomputed rows, so their positions never depend on the step layout.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch


def mrope_input_positions(num_tokens: int, spans: Sequence[tuple[int, int, Sequence[int]]],
                          spatial_merge_size: int) -> tuple[torch.Tensor, int]:
    """([3, num_tokens] int64 positions, delta) of a prompt whose images fill the
    placeholder spans (offset, length, (t, h, w) patch grid), in prompt order."""
    rows: list[torch.Tensor] = []
    pos = 0   # next text position
    index = 0  # next prompt index
    for offset, length, (t, h, w) in sorted(spans, key=lambda s: s[0]):
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        if t * gh * gw != length:
            raise ValueError(f"An image grid {(t, h, w)} gives {t * gh * gw} tokens but its "
                             f"placeholder has {length}.")
        rows.append(torch.arange(offset - index).expand(3, -1) + pos)
        pos += offset - index
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw),
                                          indexing="ij")).reshape(3, -1)
        rows.append(grid + pos)
        pos += max(gh, gw)
        index = offset + length
    rows.append(torch.arange(num_tokens - index).expand(3, -1) + pos)
    positions = torch.cat(rows, dim=1).to(torch.int64)
    last = int(positions.max()) if positions.numel() else -1
    return positions, last + 1 - num_tokens


def request_mrope_positions(state: Any, start: int, count: int) -> torch.Tensor:
    """[3, count] positions of tokens start .. start + count - 1 of a request state
    whose `mrope_positions` are set."""
    prompt = state.mrope_positions
    known = prompt[:, start:start + count]
    if known.shape[1] == count:
        return known
    first = max(start, prompt.shape[1])
    later = torch.arange(first, start + count).expand(3, -1) + state.mrope_position_delta
    return torch.cat((known, later), dim=1)


def pass_mrope_positions(model: Any, requests: Mapping[str, Any], req_ids: list[str],
                         row_offsets: list[int], num_tokens: list[int],
                         positions: torch.Tensor) -> torch.Tensor:
    """[3, rows] positions of a pass whose 1-D positions are `positions` (each row's
    token index): text-only requests and padding rows keep them on all three rows,
    requests with images get their M-RoPE rows. A request's prompt positions are
    computed on its first pass (`model.get_mrope_input_positions`)."""
    out = positions.unsqueeze(0).repeat(3, 1)
    for req_id, row, n in zip(req_ids, row_offsets, num_tokens):
        state = requests[req_id]
        if not state.mm_inputs:
            continue
        if state.mrope_positions is None:
            state.mrope_positions, state.mrope_position_delta = \
                model.get_mrope_input_positions(state.prompt_token_ids, state.mm_inputs)
        rows = request_mrope_positions(state, state.num_computed_tokens, n)
        out[:, row:row + n] = rows.to(out.device)
    return out
