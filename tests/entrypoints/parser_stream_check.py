"""A generic check for tool-call parsers: the streamed result equals the non-streamed one
whatever the chunking (the text cut in two at every position, and char by char), so a
special tag split across stream deltas anywhere is read the same."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from vllm.entrypoints.openai.tool_parsers import ToolCallStreamer


def chunkings(text: str) -> Iterator[list[str]]:
    """Every 2-way split, then one character at a time."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)


def stream(parser: Any, pieces: list[str], request: Any = None
           ) -> tuple[str, list[tuple[str, str, str]]]:
    """(content, [(id, name, arguments)]) rebuilt from the deltas, checking the delta rules
    (one entry per call index a chunk; id and name once, first)."""
    if request is not None:
        parser.adjust_request(request)  # as the server does before generating
    streamer = ToolCallStreamer(parser, request)
    content = ""
    calls: dict[int, dict[str, str]] = {}
    for i, piece in enumerate(pieces):
        delta, deltas = streamer.feed(piece, final=i == len(pieces) - 1)
        content += delta
        assert len({d.index for d in deltas}) == len(deltas), deltas
        for d in deltas:
            entry = calls.setdefault(d.index, {"args": ""})
            if d.id is not None:
                assert "id" not in entry and d.function.name, deltas
                entry.update(id=d.id, name=d.function.name)
            else:
                assert "id" in entry, "arguments before the call's header"
            entry["args"] += d.function.arguments or ""
    return content, [(calls[i]["id"], calls[i]["name"], calls[i]["args"])
                     for i in sorted(calls)]


def assert_stream_matches(make_parser: Callable[[], Any], text: str, request: Any = None,
                          model_ids: bool = False) -> Any:
    """Stream `text` in every chunking; each must rebuild the non-streamed answer (content up
    to surrounding whitespace, names, argument text; ids too when `model_ids`: the model wrote them).
    Returns the non-streamed result."""
    parser = make_parser()
    info = parser.extract_tool_calls(text, request)
    want_calls = [(c.function.name, c.function.arguments) for c in info.tool_calls]
    want_content = (info.content or "").strip()
    for pieces in chunkings(text):
        content, calls = stream(make_parser(), pieces, request)
        where = f"chunked as {pieces[:3]!r}..."
        assert content.strip() == want_content, where
        assert [(n, a) for _, n, a in calls] == want_calls, where
        if model_ids:
            assert [i for i, _, _ in calls] == [c.id for c in info.tool_calls], where
    return info
