"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, code = HTTP status.

Serving code raises `OpenAIError` (or one of its subclasses); the app's exception handlers
turn it, pydantic validation errors and unexpected exceptions into that JSON body. A client
mistake is a 4xx; 500 is reserved for real server faults.
"""
from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # the request models (pydantic) load on first use: see make_error
    from vllm.entrypoints.openai.protocol import ErrorResponse


class OpenAIError(Exception):
    """An error to return to the client as an OpenAI error body."""

    status: HTTPStatus = HTTPStatus.BAD_REQUEST
    err_type: str = "BadRequestError"

    def __init__(self, message: str, param: Optional[str] = None,
                 status: Optional[HTTPStatus] = None, err_type: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status
        if err_type is not None:
            self.err_type = err_type

    def to_response(self) -> ErrorResponse:
        return make_error(self.message, self.err_type, int(self.status), self.param)


class BadRequestError(OpenAIError):
    status = HTTPStatus.BAD_REQUEST
    err_type = "BadRequestError"


class NotFoundError(OpenAIError):
    status = HTTPStatus.NOT_FOUND
    err_type = "NotFoundError"


class ServiceUnavailableError(OpenAIError):
    status = HTTPStatus.SERVICE_UNAVAILABLE
    err_type = "ServiceUnavailableError"


class InternalServerError(OpenAIError):
    status = HTTPStatus.INTERNAL_SERVER_ERROR
    err_type = "InternalServerError"


_STATUS_TYPES = {
    400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
    404: "NotFoundError", 405: "MethodNotAllowedError", 413: "RequestTooLargeError",
    422: "UnprocessableEntityError", 429: "RateLimitError", 500: "InternalServerError",
    501: "NotImplementedError", 503: "ServiceUnavailableError",
}


def error_type_for(status: int) -> str:
    return _STATUS_TYPES.get(status, "BadRequestError" if status < 500 else
                             "InternalServerError")


def make_error(message: str, err_type: str, code: int,
               param: Optional[str] = None) -> ErrorResponse:
    # Imported here: the flag checks raise these errors before the server's engine core
    # is forked, and the request models cost ~0.4 s to import on that path.
    from vllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
    return ErrorResponse(error=ErrorInfo(message=message, type=err_type, param=param, code=code))


def validation_error(errors: list[dict[str, Any]]) -> OpenAIError:
    """Turn pydantic/FastAPI validation errors into one 400 naming the first bad field."""
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        reason = (detail.get("ctx") or {}).get("error", "invalid JSON")
        return BadRequestError(f"The request body is not valid JSON: {reason}.")
    lines = []
    for e in errors:
        loc = _dotted(e.get("loc", ()))
        lines.append(f"{loc or 'body'}: {e.get('msg', 'invalid value')}"
                     f"{_input_hint(e)}")
    count = len(errors)
    noun = "validation error" if count == 1 else "validation errors"
    param = _dotted(errors[0].get("loc", ())) if errors else None
    return BadRequestError(f"{count} {noun}: " + "; ".join(lines), param=param or None)


def lone_surrogate_path(value: Any) -> Optional[str]:
    """The dotted path of the first string (or key) of a parsed JSON body that is not valid
    Unicode, else None.

    JSON escapes can spell a lone UTF-16 surrogate ("\\ud800"); Python keeps it in the str,
    and the tokenizer (or the JSON encoder of any reply echoing it) then fails. Found up
    front, it is the client's 400 instead of a 500.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not _is_valid_unicode(item):
                return where or "body"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not _is_valid_unicode(key):
                    return where or "body"
                stack.append((name, child))
        elif isinstance(item, list):
            stack.extend((f"{where}.{i}" if where else str(i), child)
                         for i, child in reversed(list(enumerate(item))))
    return None


def _is_valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _dotted(loc: Any) -> str:
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    # FastAPI/pydantic add the union member's type name to the location (e.g.
    # "prompt.list[int]"); keep only real field names and list indices.
    kept = [str(p) for p in parts if isinstance(p, int) or _is_field_name(str(p))]
    return ".".join(kept)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "null", "any"}


def _is_field_name(part: str) -> bool:
    return part.replace("_", "a").isalnum() and part not in _TYPE_TAGS


def _input_hint(error: dict[str, Any]) -> str:
    value = error.get("input")
    if value is None or isinstance(value, (dict, list)):
        return ""
    if isinstance(value, (str, bytes, bytearray)):
        text = repr(value)
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):  # a value JSON cannot hold: never a 500 for a hint
            text = repr(value)
    return f" (got {text[:50]}{'...' if len(text) > 50 else ''})"
