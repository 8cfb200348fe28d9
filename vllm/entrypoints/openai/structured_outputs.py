"""Request fields -> StructuredOutputsParams, checked before the request reaches the engine.

A request may constrain its output through vLLM's `structured_outputs`, the older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, or OpenAI's
`response_format` (json_object, json_schema); tool_choice required / named builds a
constraint of its own (see tool_calls.py). Errors are 400s naming the field the client
used, e.g. `response_format.json_schema.schema: invalid JSON schema: ...`.
"""
from __future__ import annotations

from typing import Any, Optional

from vllm.config import StructuredOutputsConfig
from vllm.entrypoints.openai.errors import BadRequestError
from vllm.sampling_params import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_outputs_from_request(request: Any
                                    ) -> Optional[tuple[StructuredOutputsParams, str]]:
    """(params, the request field they came from), or None for unconstrained output."""
    sources: list[tuple[dict[str, Any], str]] = []
    so = getattr(request, "structured_outputs", None)
    if so is not None:
        if so.model_extra:
            raise BadRequestError(f"structured_outputs: unknown field(s) {sorted(so.model_extra)}"
                                  "; known: json, regex, choice, grammar, json_object, "
                                  "disable_any_whitespace, disable_additional_properties.",
                                  param="structured_outputs")
        sources.append((so.model_dump(by_alias=True, exclude_unset=True), "structured_outputs"))
    for name, kind in _GUIDED.items():
        value = getattr(request, name, None)
        if value is not None:
            sources.append(({kind: value}, name))
    fmt = getattr(request, "response_format", None)
    if fmt is not None and fmt.type != "text":
        sources.append(_from_response_format(fmt))
    if not sources:
        return None
    if len(sources) > 1:
        names = ", ".join(name for _, name in sources)
        raise BadRequestError(f"Only one structured output constraint may be given, got "
                              f"{names}.", param=sources[1][1])
    kwargs, param = sources[0]
    try:
        return StructuredOutputsParams(**kwargs), param
    except ValueError as e:
        raise BadRequestError(_rename(str(e), param), param=param) from None


def _from_response_format(fmt: Any) -> tuple[dict[str, Any], str]:
    if fmt.type == "json_object":
        return {"json_object": True}, "response_format"
    spec = fmt.json_schema
    if spec is None or spec.json_schema is None:
        raise BadRequestError("response_format of type 'json_schema' needs "
                              "json_schema.schema (the JSON schema of the output).",
                              param="response_format.json_schema")
    return {"json": spec.json_schema}, "response_format.json_schema.schema"


def check_structured_outputs(params: StructuredOutputsParams, param: str,
                             config: Optional[StructuredOutputsConfig]) -> None:
    """Parse the schema / regex / grammar now: a bad one is the client's 400."""
    from vllm.structured_output import validate_structured_outputs
    try:
        validate_structured_outputs(params, config or StructuredOutputsConfig())
    except ValueError as e:
        raise BadRequestError(_rename(str(e), param), param=param) from None


def _rename(message: str, param: str) -> str:
    """Name the client's field in a message about StructuredOutputsParams."""
    if param == "structured_outputs":
        return message
    head, sep, rest = message.partition(": ")
    if sep and head.startswith("structured_outputs"):
        return f"{param}: {rest}"
    return f"{param}: {message}"
