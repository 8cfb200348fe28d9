"""Stop strings, alone and fed by the incremental detokenizer."""
from __future__ import annotations

from vllm.engine.detokenizer import IncrementalDetokenizer
from vllm.engine.stop_checker import check_stop_strings


def test_truncates_before_or_after_stop_string():
    assert check_stop_strings("Hello STOP", 4, ["STOP"], False) == ("STOP", 6)
    assert check_stop_strings("Hello STOP", 4, ["STOP"], True) == ("STOP", 10)
    # Text generated after the stop string in the same step goes too.
    assert check_stop_strings("Hello STOP and more", 13, ["STOP"], True) == ("STOP", 10)
    assert check_stop_strings("Hello STOP and more", 13, ["STOP"], False) == ("STOP", 6)


def test_only_new_matches_count():
    # "STOP" lies wholly before the new character: already handled on an earlier step.
    assert check_stop_strings("abSTOPxyz", 1, ["STOP"], False) is None
    # A match ending in the new characters, started in old text, counts.
    assert check_stop_strings("abSTOP", 1, ["STOP"], False) == ("STOP", 2)
    assert check_stop_strings("abSTOP", 0, ["STOP"], False) is None
    assert check_stop_strings("abSTOP", 3, [], False) is None


def test_earliest_match_wins():
    assert check_stop_strings("one two three", 13, ["three", "two"], False) == ("two", 4)


def test_stop_string_across_token_boundaries(default_tokenizer):
    tok = default_tokenizer
    text = "The answer is 42. Observation: none"
    ids = tok.encode(text)
    stop = ["Observation:"]
    assert not any(stop[0] in tok.decode([t]) for t in ids)  # no single token holds it
    for include, expected in [(False, "The answer is 42. "),
                              (True, "The answer is 42. Observation:")]:
        d = IncrementalDetokenizer(tok, [])
        hit = None
        for count, token in enumerate(ids, start=1):
            delta = d.update([token])
            hit = check_stop_strings(d.output_text, len(delta), stop, include)
            if hit:
                d.output_text = d.output_text[:hit[1]]
                break
        assert hit is not None and hit[0] == stop[0]
        assert d.output_text == expected
        assert count < len(ids)  # stopped before the end of the stream


def test_multibyte_stop_string(default_tokenizer):
    tok = default_tokenizer
    ids = tok.encode("答案是：四十二。结束")
    d = IncrementalDetokenizer(tok, [])
    for token in ids:
        delta = d.update([token])
        hit = check_stop_strings(d.output_text, len(delta), ["。"], False)
        if hit:
            d.output_text = d.output_text[:hit[1]]
            break
    assert d.output_text == "答案是：四十二"
