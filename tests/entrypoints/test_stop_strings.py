"""Stop strings that span a token boundary never leak, streamed or not (issue: the first
token of the match used to be sent before the second one completed it)."""
from __future__ import annotations

import pytest

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def spanning_stop(pieces: list[str], text: str) -> tuple[str, str]:
    """A 4-character stop string whose first two characters end one generated token and
    whose last two begin the next (its first occurrence in `text`), and the text before."""
    assert "".join(pieces).startswith(text)  # (the EOS token adds no text)
    ends = [len("".join(pieces[:i + 1])) for i in range(len(pieces))]
    ends = [e for e in ends if e <= len(text)]
    for k in range(1, len(ends) - 1):
        start = ends[k] - 2
        if ends[k] - ends[k - 1] < 2 or ends[k + 1] - ends[k] < 2:
            continue
        stop = text[start:start + 4]
        if text.find(stop) == start and stop.strip() == stop:
            return stop, text[:start]
    raise AssertionError(f"no token boundary to span in {text!r}")


def _completion(client, model_name, stream: bool, **kw) -> tuple[str, list[str], object]:
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=30,
                                    temperature=0, stream=stream, **kw)
    if not stream:
        return out.choices[0].text, [out.choices[0].text], out.choices[0]
    chunks = [c.choices[0] for c in out if c.choices]
    return "".join(c.text for c in chunks), [c.text for c in chunks], chunks[-1]


def _chat(client, model_name, stream: bool, **kw) -> tuple[str, list[str], object]:
    out = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=30,
                                         temperature=0, stream=stream, **kw)
    if not stream:
        return out.choices[0].message.content, [out.choices[0].message.content], \
            out.choices[0]
    chunks = [c.choices[0] for c in out if c.choices]
    parts = [c.delta.content or "" for c in chunks]
    return "".join(parts), parts, chunks[-1]


def _generated_tokens(client, model_name, api) -> tuple[str, list[str]]:
    """The greedy text and the text of each generated token (from logprobs)."""
    if api == "completions":
        out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=30,
                                        temperature=0, logprobs=0)
        return out.choices[0].text, list(out.choices[0].logprobs.tokens)
    out = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=30,
                                         temperature=0, logprobs=True)
    return (out.choices[0].message.content,
            [e.token for e in out.choices[0].logprobs.content])


def test_known_reproduction(client, model_name):
    """" Paris.\\n\\nThe answer is" with stop "he a" ("The" | " answer") ends at "T"."""
    base, _, _ = _completion(client, model_name, False)
    assert base.startswith(" Paris.\n\nThe answer"), base
    for stream in (False, True):
        text, _, last = _completion(client, model_name, stream, stop=["he a"])
        assert text == " Paris.\n\nT", (stream, text)
        assert last.finish_reason == "stop"


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_stop_spanning_token_boundary(client, model_name, api, stream):
    call = _completion if api == "completions" else _chat
    base, pieces = _generated_tokens(client, model_name, api)
    stop, expected = spanning_stop(pieces, base)
    # A longer stop string that never matches makes the hold-back window wider.
    stops = [stop, "\x00never\x00matches\x00"]
    text, parts, last = call(client, model_name, stream, stop=stops)
    assert text == expected, (stop, base)
    assert last.finish_reason == "stop" and last.stop_reason == stop
    held_back = max(map(len, stops)) - 1
    if stream and len(expected) > 2 * held_back:
        # Really streamed in pieces (a match inside the hold-back window of the first
        # characters legitimately arrives as one piece).
        assert len(parts) > 2, parts
