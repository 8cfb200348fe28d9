"""Wire format between the frontend and an engine core in another process.

One message is one msgpack document (msgspec): `[kind, *fields]`. The per-step hot
message, a batch of `EngineCoreOutput`s, travels as plain msgpack arrays (ints, floats,
strings: no pickling, decoded straight back into the dataclass). Everything msgpack has
no type for (a `Request` with its SamplingParams, an exception, an admin call's
arguments, which may hold a function) travels as a msgpack extension holding a pickle:
plain pickle when it can, cloudpickle (functions by value) when it cannot.
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import cloudpickle
import msgspec

from vllm.core.scheduler import EngineCoreOutput

_PICKLE_EXT = 1

# Message kinds, frontend -> core.
ADD = "add"
ABORT = "abort"
UTILITY = "utility"
SHUTDOWN = "shutdown"
HELLO = "hello"
"""A frontend's first message to a shared core (vllm/engine/core_server.py)."""
# Message kinds, core -> frontend.
READY = "ready"
FAILED = "failed"
OUTPUTS = "outputs"
UTILITY_REPLY = "utility_reply"
DEAD = "dead"


def _enc_hook(obj: Any) -> Any:
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - lambdas, local classes: pickled by value instead
        data = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return msgspec.msgpack.Ext(_PICKLE_EXT, data)


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _PICKLE_EXT:
        return pickle.loads(data)
    raise ValueError(f"Unknown msgpack extension type {code} in an engine-core message.")


class MessageEncoder:
    """Encodes one message; not thread-safe (msgspec reuses its buffer)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)

    def encode(self, kind: str, *fields: Any) -> bytes:
        return self._encoder.encode([kind, *fields])

    @staticmethod
    def opaque(obj: Any) -> msgspec.msgpack.Ext:
        """Force `obj` through pickle (a dataclass msgpack would turn into a dict)."""
        return _enc_hook(obj)


class MessageDecoder:

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)

    def decode(self, data: bytes) -> list[Any]:
        return self._decoder.decode(data)


_OUTPUT_FIELDS = tuple(f.name for f in dataclasses.fields(EngineCoreOutput))


def pack_outputs(outputs: list[EngineCoreOutput]) -> list[list[Any]]:
    """EngineCoreOutputs as msgpack arrays, in the dataclass's field order (a tensor
    field, a pooling request's vector, travels pickled)."""
    return [[getattr(o, name) for name in _OUTPUT_FIELDS] for o in outputs]


def unpack_outputs(rows: list[list[Any]]) -> list[EngineCoreOutput]:
    outputs = []
    for row in rows:
        out = EngineCoreOutput(**dict(zip(_OUTPUT_FIELDS, row)))
        # msgpack has no tuples: the logprob rows were (ids, logprobs, rank) tuples.
        if out.new_logprobs is not None:
            out.new_logprobs = [tuple(entry) for entry in out.new_logprobs]
        if out.new_prompt_logprobs is not None:
            out.new_prompt_logprobs = tuple(out.new_prompt_logprobs)
        outputs.append(out)
    return outputs
