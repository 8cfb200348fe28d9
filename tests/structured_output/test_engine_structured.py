"""Structured outputs through the offline engine on the default model.

Outputs are checked by references we did not write: `jsonschema` for JSON, `re` for
regexes; n > 1 and a repeated prompt (prefix-cache hit) get a matcher of their own.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from vllm.sampling_params import SamplingParams, StructuredOutputsParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
}


@pytest.fixture(scope="module")
def llm():
    from vllm import LLM
    return LLM(max_model_len=1024, max_num_seqs=16, kv_cache_memory_bytes=128 << 20)


def test_json_schema_with_n_and_prefix_cache(llm):
    prompt = "Describe a user of a web site as JSON with fields name, age and role:"
    params = SamplingParams(temperature=1.0, n=3, seed=3, max_tokens=80,
                            structured_outputs=StructuredOutputsParams(json=PERSON))
    first = llm.generate([prompt], params, use_tqdm=False)[0]
    again = llm.generate([prompt], params, use_tqdm=False)[0]  # prefix-cache hit
    assert again.num_cached_tokens > 0
    for out in (first, again):
        assert len(out.outputs) == 3
        for c in out.outputs:
            assert c.finish_reason == "stop", c.text
            jsonschema.validate(json.loads(c.text), PERSON)


def test_mixed_batch_regex_choice_grammar_and_free(llm):
    prompts = ["Phone:", "Is the sky blue?", "Tag:", "Numbers:", "Hello"]
    so = [StructuredOutputsParams(regex=r"\(\d{3}\) \d{3}-\d{4}"),
          StructuredOutputsParams(choice=["yes", "no"]),
          StructuredOutputsParams(grammar='start: "<" NAME ">"\nNAME: /[a-z]{1,8}/'),
          StructuredOutputsParams(grammar='root ::= "[" num ("," num)? ("," num)? "]"\n'
                                          'num ::= [1-9] [0-9]?'),
          None]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured_outputs=s)
              for i, s in enumerate(so)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", texts[0]), texts[0]
    assert texts[1] in ("yes", "no")
    assert re.fullmatch(r"<[a-z]{1,8}>", texts[2]), texts[2]
    assert re.fullmatch(r"\[[1-9][0-9]?(,[1-9][0-9]?){0,2}\]", texts[3]), texts[3]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[:4])


def test_short_max_tokens_ends_with_length_and_valid_prefix(llm):
    params = SamplingParams(temperature=0.0, max_tokens=4,
                            structured_outputs=StructuredOutputsParams(json=PERSON))
    out = llm.generate(["JSON:"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length"
    assert out.text.startswith("{")


def test_invalid_constraint_is_refused_before_queueing(llm):
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        llm.generate(["x"], SamplingParams(
            structured_outputs=StructuredOutputsParams(regex="(unclosed")), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize("disable_any_whitespace", [True, False], ids=["compact", "bounded"])
def test_sampled_json_is_never_cut_in_whitespace(llm, disable_any_whitespace):
    """20 seeded temperature-1 json_schema requests (max_tokens 200): compact JSON, or
    whitespace runs bounded by default, leave no output cut by length inside the JSON
    (unbounded runs let 3 of 12 such requests end in whitespace)."""
    prompt = "Describe a user of a web site as JSON with fields name, age and role:"
    so = StructuredOutputsParams(json=PERSON, disable_any_whitespace=disable_any_whitespace)
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=200,
                             structured_outputs=so) for i in range(20)]
    outs = llm.generate([prompt] * 20, params, use_tqdm=False)
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), PERSON)
        if disable_any_whitespace:  # the backend's fixed separators, no free whitespace
            assert "  " not in c.text and "\n" not in c.text, c.text


def test_json_properties_come_in_the_schema_order(llm):
    """A schema that lists "zeta" before "alpha" gets them in that order (vLLM compiles
    the schema as given; sorting its keys would make a model answer before reasoning)."""
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"},
                                               "alpha": {"type": "integer"}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    out = llm.generate(["Two numbers as JSON:"], SamplingParams(
        temperature=0.0, max_tokens=40,
        structured_outputs=StructuredOutputsParams(json=schema)), use_tqdm=False)[0]
    value = json.loads(out.outputs[0].text)
    jsonschema.validate(value, schema)
    assert list(value) == ["zeta", "alpha"]
