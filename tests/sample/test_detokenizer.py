"""Incremental detokenization with the default model's tokenizer."""
from __future__ import annotations

import random

import pytest

from vllm.engine import detokenizer as detok_module
from vllm.engine.detokenizer import IncrementalDetokenizer, decode_token_text

MULTIBYTE = "Hello 世界! Emoji: 🎉👍🏽 — naïve façade, 日本語のテキスト. Done"


def stream(tok, prompt_ids, ids, **kwargs):
    d = IncrementalDetokenizer(tok, prompt_ids, **kwargs)
    deltas = [d.update([t]) for t in ids]
    return d, deltas


def test_multibyte_characters_never_emit_replacement(default_tokenizer):
    tok = default_tokenizer
    ids = tok.encode(MULTIBYTE)
    # The byte-level vocabulary really splits these characters across tokens.
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    d, deltas = stream(tok, tok.encode("Say:"), ids)
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) == d.output_text == MULTIBYTE
    assert d.flush() == ""
    assert d.num_output_tokens == len(ids)


def test_leading_space_of_first_token_kept(default_tokenizer):
    tok = default_tokenizer
    prompt = tok.encode("The capital of France is")
    ids = tok.encode(" Paris, of course.")
    d, _ = stream(tok, prompt, ids)
    assert d.output_text == " Paris, of course."


def test_special_tokens_skipped_or_kept(default_tokenizer):
    tok = default_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Hi there") + [im_end] + tok.encode(" bye")
    skipped, _ = stream(tok, [], ids)
    assert skipped.output_text == "Hi there bye"
    kept, _ = stream(tok, [], ids, skip_special_tokens=False)
    assert kept.output_text == "Hi there<|im_end|> bye"


def test_several_tokens_per_update(default_tokenizer):
    tok = default_tokenizer
    ids = tok.encode(MULTIBYTE)
    d = IncrementalDetokenizer(tok, [])
    pieces = [d.update(ids[i:i + 3]) for i in range(0, len(ids), 3)]
    assert "".join(pieces) == MULTIBYTE


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_streams_equal_full_decode(default_tokenizer, skip_special_tokens):
    tok = default_tokenizer
    rng = random.Random(0)
    vocab = len(tok)
    # Lone byte pieces (invalid or partial UTF-8) make the hardest streams.
    fragments = [i for i in range(vocab) if "\ufffd" in tok.decode([i])][:400]
    specials = list(tok.all_special_ids)
    prompt = tok.encode("Prompt text")
    for _ in range(300):
        pool = rng.choice([fragments, range(vocab)])
        ids = [rng.choice(pool) if rng.random() < 0.8 else rng.choice(specials)
               for _ in range(rng.randrange(1, 30))]
        d, deltas = stream(tok, prompt, ids, skip_special_tokens=skip_special_tokens)
        tail = d.flush()
        expected = tok.decode(ids, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) + tail == d.output_text == expected, ids


def test_decodes_small_windows_only(default_tokenizer, monkeypatch):
    tok = default_tokenizer
    longest = 0
    real = detok_module.make_decode_fn

    def spy(*args):
        decode = real(*args)

        def wrapped(ids):
            nonlocal longest
            longest = max(longest, len(ids))
            return decode(ids)
        return wrapped

    monkeypatch.setattr(detok_module, "make_decode_fn", spy)
    ids = tok.encode("word " * 600)
    d, _ = stream(tok, tok.encode("x " * 50), ids)
    assert d.output_text == "word " * 600
    assert longest <= 8
    assert len(d._tokens) <= detok_module._TRIM_THRESHOLD + 8


class _SlowTokenizer:
    """A tokenizer without a Rust backend: decoding goes through `decode`."""

    def __init__(self, fast):
        self.fast = fast
        self.calls = []

    def decode(self, ids, skip_special_tokens=False, spaces_between_special_tokens=True,
               clean_up_tokenization_spaces=None):
        self.calls.append(spaces_between_special_tokens)
        return self.fast.decode(ids, skip_special_tokens=skip_special_tokens)


def test_tokenizer_without_backend_uses_decode(default_tokenizer):
    slow = _SlowTokenizer(default_tokenizer)
    ids = default_tokenizer.encode(MULTIBYTE)
    d, _ = stream(slow, [], ids, spaces_between_special_tokens=False)
    assert d.output_text == MULTIBYTE
    assert slow.calls and not any(slow.calls)


def test_logprob_token_text(default_tokenizer):
    tok = default_tokenizer
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    d = IncrementalDetokenizer(tok, [])
    assert d.decode_logprob_token(im_start) == "<|im_start|>"
    hello = tok.encode(" Hello")[0]
    assert decode_token_text(tok, hello) == " Hello"
    piece = next(t for t in tok.encode("世") if "\ufffd" in tok.decode([t]))
    assert decode_token_text(tok, piece) == "\ufffd"
