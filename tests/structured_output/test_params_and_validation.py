"""StructuredOutputsParams checks, spec normalization and frontend validation errors."""
from __future__ import annotations

import json

import pytest

from vllm.config import StructuredOutputsConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.structured_output import grammar_spec, validate_structured_outputs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of"),
    ({"json": SCHEMA, "regex": "a+"}, "got json, regex"),
    ({"choice": []}, "choice must be a non-empty list"),
    ({"choice": ["a", 1]}, "choice must be a non-empty list"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"grammar": 5}, "grammar must be a non-empty string"),
    ({"json": 3}, "json must be a JSON schema"),
    ({"json_object": "yes"}, "json_object must be true"),
    ({"structural_tag": "{}"}, "structural_tag must be JSON text of"),
])
def test_params_refuse_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_accepts_dict_and_refuses_unknown_keys():
    sp = SamplingParams(structured_outputs={"regex": "[0-9]+"})
    assert sp.structured_outputs.kind == "regex"
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"jsn": SCHEMA})
    with pytest.raises(ValueError, match="StructuredOutputsParams"):
        SamplingParams(structured_outputs=["regex"])
    assert sp.clone().structured_outputs == sp.structured_outputs


def test_spec_normalization_is_the_cache_key():
    a = grammar_spec(StructuredOutputsParams(json=SCHEMA))
    same = grammar_spec(StructuredOutputsParams(json=json.dumps(SCHEMA)))  # text or dict
    assert a == same and hash(a) == hash(same)
    # Key order is kept (properties are generated in the schema's order): another order
    # is another grammar.
    b = grammar_spec(StructuredOutputsParams(
        json='{"required": ["a"], "properties": {"a": {"type": "integer"}}, "type": "object"}'))
    assert a != b
    assert grammar_spec(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)) != a
    choice = grammar_spec(StructuredOutputsParams(choice=['say "hi"', "café"]))
    assert choice.kind == "grammar_ebnf"
    assert choice.spec == 'root ::= "say \\"hi\\"" | "café"'
    assert grammar_spec(StructuredOutputsParams(json_object=True)).spec == '{"type": "object"}'
    assert grammar_spec(StructuredOutputsParams(grammar='root ::= "x"')).kind == "grammar_ebnf"
    assert grammar_spec(StructuredOutputsParams(grammar='start: "x"')).kind == "grammar_lark"
    closed = grammar_spec(StructuredOutputsParams(json=SCHEMA,
                                                  disable_additional_properties=True))
    assert '"additionalProperties": false' in closed.spec


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "guidance"])
@pytest.mark.parametrize("kwargs, field, what", [
    ({"json": {"type": "foo"}}, "structured_outputs.json", "foo"),
    ({"json": "{not json"}, "structured_outputs.json", "not valid JSON"),
    ({"regex": "(ab"}, "structured_outputs.regex", "regex"),
    ({"regex": "[a-"}, "structured_outputs.regex", "regex"),
    ({"grammar": 'root ::= ("a" '}, "structured_outputs.grammar", "grammar"),
    ({"grammar": 'root ::= missing_rule'}, "structured_outputs.grammar", "grammar"),
])
def test_invalid_constraints_name_the_field(backend, kwargs, field, what):
    config = StructuredOutputsConfig(backend=backend)
    with pytest.raises(ValueError) as info:
        validate_structured_outputs(StructuredOutputsParams(**kwargs), config)
    message = str(info.value)
    assert message.startswith(field), message
    assert what.lower() in message.lower(), message
    assert "/project/" not in message and ".cc:" not in message


def test_backend_selection():
    auto = StructuredOutputsConfig()
    ok = validate_structured_outputs(StructuredOutputsParams(json=SCHEMA), auto)
    assert ok.backend == "xgrammar"
    lark = validate_structured_outputs(
        StructuredOutputsParams(grammar='start: "a" NAME\nNAME: /[a-z]+/'), auto)
    assert lark.backend == "guidance"
    with pytest.raises(ValueError, match="guidance backend for Lark"):
        validate_structured_outputs(StructuredOutputsParams(grammar='start: "a"'),
                                    StructuredOutputsConfig(backend="xgrammar"))
    gbnf = validate_structured_outputs(StructuredOutputsParams(grammar='root ::= "a"'),
                                       StructuredOutputsConfig(backend="llguidance"))
    assert gbnf.backend == "guidance"


def test_config_from_cli():
    assert StructuredOutputsConfig.from_cli('{"backend": "guidance"}').backend == "guidance"
    assert StructuredOutputsConfig.from_cli(None).backend == "auto"
    with pytest.raises(ValueError, match="unknown key"):
        StructuredOutputsConfig.from_cli('{"backnd": "xgrammar"}')
    with pytest.raises(ValueError, match="backend"):
        StructuredOutputsConfig.from_cli('{"backend": "outlines"}')
    with pytest.raises(ValueError, match="reasoning_parser"):
        StructuredOutputsConfig(reasoning_parser="nope")


def test_request_field_is_the_params_dataclass():
    """The server's `structured_outputs` body model is generated from
    StructuredOutputsParams: one definition of the fields, types and defaults."""
    import dataclasses

    from vllm.entrypoints.openai.protocol import StructuredOutputsRequest
    from vllm.sampling_params import StructuredOutputsParams
    params_fields = {f.name: f.default for f in dataclasses.fields(StructuredOutputsParams)
                     if f.init}
    request_fields = {(f.alias or name): f.default
                      for name, f in StructuredOutputsRequest.model_fields.items()}
    assert request_fields == params_fields
    body = StructuredOutputsRequest.model_validate({"json": {"type": "object"},
                                                    "disable_any_whitespace": True})
    params = StructuredOutputsParams(**body.model_dump(by_alias=True, exclude_unset=True))
    assert params.json == {"type": "object"} and params.disable_any_whitespace


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_json_whitespace_runs_are_bounded_by_default(default_tokenizer, backend):
    """A JSON constraint allows at most MAX_WHITESPACE whitespace characters in a row
    (unbounded runs let a temperature-1 sample spend max_tokens on spaces); with
    disable_any_whitespace none; a request's whitespace_pattern is its own bound."""
    from vllm.structured_output.backend_types import MAX_WHITESPACE, grammar_spec
    if backend == "xgrammar":
        from vllm.structured_output.backend_xgrammar import XgrammarBackend as Backend
    else:
        from vllm.structured_output.backend_guidance import GuidanceBackend as Backend
    tok = default_tokenizer
    kwargs = {"max_threads": 1} if backend == "xgrammar" else {}
    be = Backend(tok, len(tok), [tok.eos_token_id], **kwargs)
    brace, space = tok.encode("{")[0], tok.encode(" ")[0]
    assert tok.decode([space]) == " "

    def accepts_spaces(params: StructuredOutputsParams, n: int) -> bool:
        grammar = be.new_grammar(be.compile(grammar_spec(params)))
        return grammar.accept_tokens([brace]) and grammar.accept_tokens([space] * n)

    default = StructuredOutputsParams(json={"type": "object"})
    assert accepts_spaces(default, MAX_WHITESPACE)
    assert not accepts_spaces(default, MAX_WHITESPACE + 1)
    assert not accepts_spaces(StructuredOutputsParams(json={"type": "object"},
                                                      disable_any_whitespace=True), 1)
    if backend == "guidance":
        two = StructuredOutputsParams(json={"type": "object"}, whitespace_pattern="[ ]{0,2}")
        assert accepts_spaces(two, 2) and not accepts_spaces(two, 3)


def test_whitespace_pattern_picks_guidance_and_is_checked():
    from vllm.config import StructuredOutputsConfig
    from vllm.structured_output.manager import validate_structured_outputs
    params = StructuredOutputsParams(json={"type": "object"}, whitespace_pattern="[ ]?")
    assert validate_structured_outputs(params, StructuredOutputsConfig()).backend == "guidance"
    with pytest.raises(ValueError, match="whitespace_pattern needs the guidance backend"):
        validate_structured_outputs(params, StructuredOutputsConfig(backend="xgrammar"))
    with pytest.raises(ValueError, match="unclosed character class"):
        validate_structured_outputs(StructuredOutputsParams(json={"type": "object"},
                                                            whitespace_pattern="[ "),
                                    StructuredOutputsConfig())
    with pytest.raises(ValueError, match="whitespace_pattern applies to json"):
        StructuredOutputsParams(regex="a+", whitespace_pattern=" ?")
