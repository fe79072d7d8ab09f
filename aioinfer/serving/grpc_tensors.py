"""KServe v2 gRPC tensors: a ``ModelInferRequest`` decoded into the service's
:class:`~aioinfer.serving.messages.InferenceRequest`, an
:class:`~aioinfer.serving.messages.InferenceResponse` encoded as a ``ModelInferResponse``.

The messages are tritonclient's generated protocol modules (``service_pb2``), so that the
server and the clients read the same ``.proto``. An input's values come either from
``raw_input_contents`` (one entry per input, in input order: little-endian values, or for
BYTES each element as a 4-byte little-endian length and its bytes; what tritonclient
sends) or from the typed field of ``contents`` that its datatype uses. Outputs always go in
``raw_output_contents``: tritonclient cannot decode typed output contents. The checks and
their messages are the REST decoder's (:mod:`aioinfer.serving.protocol`), so that a client
reads the same refusal on either transport.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from aioinfer.errors import ProtocolError
from aioinfer.serving.json_values import object_array
from aioinfer.serving.messages import (
    DATATYPES,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    datatype,
)
from aioinfer.serving.protocol import MAX_ELEMENTS, MAX_RANK

ModelInferRequest = service_pb2.ModelInferRequest
ModelInferResponse = service_pb2.ModelInferResponse
_OutputTensor = service_pb2.ModelInferResponse.InferOutputTensor

CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The field of ``InferTensorContents`` that holds each datatype's values (FP16 has
none: it comes in ``raw_input_contents`` only)."""

_LITTLE_ENDIAN = {name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items()}


def decode_infer_request(message: Any, inputs: Mapping[str, str]) -> InferenceRequest:
    """Decode a ``ModelInferRequest`` against the model's inputs (name -> datatype).

    Every output is answered in ``raw_output_contents`` (binary), the outputs asked for
    when the message names some, else every output.

    Raises:
        ProtocolError: an unknown, repeated or missing input, a datatype or shape that
            disagrees with the data or the model, raw contents that are not one per
            input, or a typed value out of its datatype's range.
    """
    raw = message.raw_input_contents
    tensors = message.inputs
    if raw and len(raw) != len(tensors):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(tensors)} inputs: "
            "give one per input, in input order, or none"
        )
    arrays: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(tensors):
        name = tensor.name
        expected = inputs.get(name)
        if expected is None:
            known = ", ".join(map(repr, inputs)) or "none"
            raise ProtocolError(f"the model has no input named {name!r}; its inputs are {known}")
        if tensor.datatype != expected:
            raise ProtocolError(
                f"input {name!r}: datatype {tensor.datatype!r} given, the model takes {expected}"
            )
        if name in arrays:
            raise ProtocolError(f"input {name!r} is given twice")
        shape, count = _shape(name, tensor.shape)
        if raw:
            flat = _from_raw(name, raw[index], expected, count)
        else:
            flat = _from_contents(name, tensor.contents, expected, count)
        arrays[name] = flat.reshape(shape)
    missing = [name for name in inputs if name not in arrays]
    if missing:
        raise ProtocolError(f"missing input(s) {', '.join(map(repr, missing))}")
    outputs = message.outputs
    requested = [RequestedOutput(output.name, True) for output in outputs] if outputs else None
    parameters = _parameters(message.parameters) if message.parameters else {}
    return InferenceRequest(message.id or None, parameters, arrays, requested, True)


def encode_infer_response(response: InferenceResponse) -> Any:
    """The ``ModelInferResponse`` of ``response``: every output in
    ``raw_output_contents``."""
    outputs = []
    contents = []
    for name, array, _ in response.outputs:
        outputs.append(_OutputTensor(name=name, datatype=datatype(array.dtype), shape=array.shape))
        contents.append(_to_bytes(array))
    return ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
        outputs=outputs,
        raw_output_contents=contents,
    )


def _shape(name: str, dims: Any) -> tuple[list[int], int]:
    """The shape ``dims`` as a list, and its element count."""
    shape = list(dims)
    if shape and min(shape) < 0:
        raise ProtocolError(f"input {name!r}: 'shape' must be a list of integers >= 0, got {shape}")
    if len(shape) > MAX_RANK:
        raise ProtocolError(
            f"input {name!r}: 'shape' has {len(shape)} dimensions, at most {MAX_RANK} are supported"
        )
    count = math.prod(shape)
    # A shape with a zero dimension holds no elements, but its other ones still count.
    if count > MAX_ELEMENTS or (not count and math.prod([d or 1 for d in shape]) > MAX_ELEMENTS):
        raise ProtocolError(f"input {name!r}: 'shape' {shape} is too large")
    return shape, count


def _from_raw(name: str, chunk: bytes, kind: str, count: int) -> np.ndarray:
    if kind == "BYTES":
        items = _unpack_bytes(name, chunk)
        if len(items) != count:
            raise ProtocolError(f"input {name!r}: {len(items)} strings for {count} elements")
        return object_array(items)
    dtype = _LITTLE_ENDIAN[kind]
    if len(chunk) != count * dtype.itemsize:
        raise ProtocolError(
            f"input {name!r}: {len(chunk)} binary bytes, the shape needs "
            f"{count} x {dtype.itemsize} = {count * dtype.itemsize}"
        )
    return np.frombuffer(chunk, dtype).astype(DATATYPES[kind], copy=False)


def _unpack_bytes(name: str, chunk: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(chunk):
        if offset + 4 > len(chunk):
            raise ProtocolError(f"input {name!r}: truncated BYTES element length")
        (length,) = struct.unpack_from("<I", chunk, offset)
        offset += 4
        if offset + length > len(chunk):
            raise ProtocolError(f"input {name!r}: truncated BYTES element")
        items.append(chunk[offset : offset + length])
        offset += length
    return items


def _from_contents(name: str, contents: Any, kind: str, count: int) -> np.ndarray:
    field = CONTENTS_FIELDS.get(kind)
    if field is None:
        raise ProtocolError(
            f"input {name!r}: {kind} has no typed contents field; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if len(values) != count:
        raise ProtocolError(
            f"input {name!r}: {len(values)} values in contents.{field}, the shape needs {count}"
        )
    if kind == "BYTES":
        return object_array(list(values))
    dtype = DATATYPES[kind]
    if dtype.kind not in "iu" or dtype.itemsize >= 4:
        return np.array(values, dtype)  # the field's own type: every value fits
    wide = np.array(values, np.int64)
    narrow = wide.astype(dtype)
    if count and (narrow != wide).any():
        index = int(np.argmax(narrow != wide))
        info = np.iinfo(dtype)
        raise ProtocolError(
            f"input {name!r}: element {index} of contents.{field} is {wide[index]}, out of "
            f"the range of {kind} [{info.min}, {info.max}]"
        )
    return narrow


def _parameters(parameters: Any) -> dict[str, Any]:
    """``InferParameter`` values by name (an empty one, with no value set, is left out)."""
    values = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is not None:
            values[key] = getattr(parameter, choice)
    return values


def _to_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind in "OSU":  # BYTES
        parts = []
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()
