"""Stop strings: find one in the newly detokenized tail of the output text."""
from __future__ import annotations

from typing import Optional, Sequence


def check_stop_strings(output_text: str, new_char_count: int, stop: Sequence[str],
                       include_stop_str_in_output: bool) -> Optional[tuple[str, int]]:
    """Return (stop string, length to truncate output_text to), or None.

    Only matches that end inside the `new_char_count` newest characters are new, so
    only the tail `len(stop_str) - 1 + new_char_count` long is searched (the text
    before it was checked on earlier steps). If several stop strings match, the one
    that starts first in the text wins. The text is cut before the stop string, or
    right after it with include_stop_str_in_output (anything generated after the stop
    string in the same step is dropped either way).
    """
    if not new_char_count or not stop:
        return None
    best: Optional[tuple[int, str]] = None
    text_len = len(output_text)
    for stop_str in stop:
        start = max(0, text_len - new_char_count - len(stop_str) + 1)
        index = output_text.find(stop_str, start)
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop_str)
    if best is None:
        return None
    index, stop_str = best
    return stop_str, index + len(stop_str) if include_stop_str_in_output else index
