"""Score inputs shared by `LLM.score` and the score / rerank routes: vLLM's pairing of
the two sides and a cross-encoder's joint tokenization of a pair."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

ScoreInput = Union[str, dict[str, Any]]


def cross_encoder_prompt(tokenizer, text_1: str, text_2: str, hf_config: Any,
                         tokenization_kwargs: Optional[dict[str, Any]] = None
                         ) -> tuple[dict[str, Any], Optional[int]]:
    """({"prompt_token_ids"}, where token type 1 starts or None) of a query/document
    pair, tokenized together as the cross-encoder was trained (token types only for
    models that have them: BERT yes, XLM-R no)."""
    encoded = tokenizer(text_1, text_pair=text_2, **(tokenization_kwargs or {}))
    uses_types = getattr(hf_config, "type_vocab_size", 1) > 1
    types = encoded.get("token_type_ids") if uses_types else None
    split = types.index(1) if types and 1 in types else None
    return {"prompt_token_ids": list(encoded["input_ids"])}, split


def pair_inputs(data_1: Union[ScoreInput, Sequence[ScoreInput]],
                data_2: Union[ScoreInput, Sequence[ScoreInput]]
                ) -> tuple[list[ScoreInput], list[ScoreInput]]:
    """vLLM's pairing: 1 -> 1, 1 -> N (the first repeated) or N -> N."""
    first = [data_1] if isinstance(data_1, (str, dict)) else list(data_1)
    second = [data_2] if isinstance(data_2, (str, dict)) else list(data_2)
    if not first or not second:
        raise ValueError("At least one text element must be given in each input.")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValueError("The number of inputs in data_1 and data_2 must be the same "
                         f"(or data_1 a single input); got {len(first)} and {len(second)}.")
    return first, second


def score_text(item: ScoreInput) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("prompt"), str):
        return item["prompt"]
    raise ValueError(f"Score inputs must be strings (or {{'prompt': str}}), got {item!r}.")
