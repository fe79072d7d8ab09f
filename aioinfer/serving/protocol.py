"""The Open Inference Protocol (KServe v2) REST bodies: decoding requests into the
service's :class:`~aioinfer.serving.messages.InferenceRequest`, encoding its responses.

An infer request body is a JSON header, optionally followed by raw tensor bytes (the
binary tensor data extension): the ``Inference-Header-Content-Length`` HTTP header gives
the JSON part's length, and each input with ``parameters.binary_data_size`` takes that
many bytes from the rest, in input order. Responses use the same layout for outputs asked
for in binary form (``parameters.binary_data`` per output, or ``binary_data_output`` for
the whole request). Tensor values in JSON are read and written by
:mod:`aioinfer.serving.json_values`. Every malformed body raises :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from aioinfer.errors import ProtocolError
from aioinfer.model import Port
from aioinfer.serving.json_values import from_json, object_array, spell_special_floats, to_json
from aioinfer.serving.messages import (
    DATATYPES,
    InferenceRequest,
    RequestedOutput,
    SharedInput,
    SharedMemoryRef,
    TensorMetadata,
    datatype,
)

HEADER_LENGTH = b"inference-header-content-length"
"""The HTTP header that gives the JSON part's length of a body with binary tensors."""

_LITTLE_ENDIAN = {name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items()}
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# The bare literals NaN/Infinity/-Infinity become the strings that stand for them, so
# that the tensor decoding sees them the same way (and an infinite float can only come
# from a number that overflowed).
_DECODER = json.JSONDecoder(parse_constant=str)

MAX_RANK = 32
"""The most dimensions an input may have (numpy 1.x's limit; numpy 2 allows 64)."""
MAX_ELEMENTS = 2**62
"""A shape whose non-zero dimensions multiply to more is refused, even with no elements."""
MAX_HEADER_DIGITS = 18
"""Longer ``Inference-Header-Content-Length`` values are refused (no body is that big)."""


def port_metadata(port: Port) -> dict[str, Any]:
    """``{"name", "datatype", "shape"}`` of a model port; -1 marks a dynamic dimension."""
    return asdict(TensorMetadata.of(port))


def parse_infer_request(
    body: bytes, header_length: str | None, inputs: Mapping[str, str]
) -> InferenceRequest:
    """Decode an infer request body against the model's inputs (name -> datatype).

    Raises:
        ProtocolError: malformed JSON, an unknown or missing input, a datatype or shape
            that disagrees with the data or the model, or binary sizes that do not add up.
    """
    length = None if header_length is None else _header_length(header_length, len(body))
    return _parse(body, length, inputs)[0]


def _header_length(value: str, size: int) -> int:
    """The JSON part's length from ``Inference-Header-Content-Length``, checked against
    the body's ``size``."""
    if not (value.isascii() and value.isdigit() and len(value) <= MAX_HEADER_DIGITS):
        shown = value if len(value) <= 40 else f"{value[:20]}... ({len(value)} characters)"
        raise ProtocolError(f"Inference-Header-Content-Length must be a byte count, got {shown!r}")
    length = int(value)
    if length > size:
        raise ProtocolError(
            f"Inference-Header-Content-Length is {length}, but the body has {size} bytes"
        )
    return length


@dataclass(frozen=True)
class _BinaryLayout:
    """What a JSON header says, for a request whose inputs are all fixed-size binary
    tensors: everything but the tensor bytes, which each request brings anew."""

    request: InferenceRequest
    """The header's fields (with no ``inputs``)."""
    inputs: tuple[tuple[str, np.dtype, np.dtype, tuple[int, ...], int], ...]
    """Per input, in body order: name, wire dtype, numpy dtype, shape, byte size."""
    size: int
    """The bytes that follow the header."""

    def decode(self, body: bytes, offset: int) -> InferenceRequest:
        arrays: dict[str, np.ndarray] = {}
        for name, wire, native, shape, size in self.inputs:
            array = np.frombuffer(body, wire, size // wire.itemsize, offset)
            arrays[name] = array.astype(native, copy=False).reshape(shape)
            offset += size
        request = self.request
        return InferenceRequest(
            request.id, request.parameters, arrays, request.outputs, request.binary_output
        )


class RequestDecoder:
    """Decodes one model's infer requests (as :func:`parse_infer_request`), remembering
    the JSON headers of recent requests whose inputs are all binary: a client sends the
    same header with new tensor bytes each time, and a header seen before is neither
    parsed nor checked again. Only the tensor bytes are read anew (their sizes still
    have to add up)."""

    MAX_HEADER_BYTES = 4096
    """Longer headers are not remembered."""

    def __init__(self, inputs: Mapping[str, str], size: int = 64) -> None:
        self.inputs = dict(inputs)
        """The model's inputs: name -> protocol datatype."""
        self.size = size
        self._layouts: dict[bytes, _BinaryLayout] = {}

    def decode(self, body: bytes, header_length: str | None) -> InferenceRequest:
        """Decode ``body``; raises as :func:`parse_infer_request`."""
        if header_length is None:
            return _parse(body, None, self.inputs)[0]
        length = _header_length(header_length, len(body))
        layout = self._layouts.get(body[:length])
        if layout is not None and len(body) - length == layout.size:
            return layout.decode(body, length)
        request, binary = _parse(body, length, self.inputs)
        if binary:
            self._remember(body[:length], request)
        return request

    def _remember(self, header: bytes, request: InferenceRequest) -> None:
        if len(header) > self.MAX_HEADER_BYTES:
            return
        inputs = []
        for name, array in request.inputs.items():
            kind = self.inputs[name]
            inputs.append((name, _LITTLE_ENDIAN[kind], DATATYPES[kind], array.shape, array.nbytes))
        if len(self._layouts) >= self.size:
            del self._layouts[next(iter(self._layouts))]  # the oldest
        size = sum(entry[-1] for entry in inputs)
        # Without the tensors: a remembered header must not keep a request's data alive.
        fields = dataclasses.replace(request, inputs={})
        self._layouts[header] = _BinaryLayout(fields, tuple(inputs), size)


def _parse(
    body: bytes, header_length: int | None, inputs: Mapping[str, str]
) -> tuple[InferenceRequest, bool]:
    """The decoded request, and whether all its inputs were fixed-size binary tensors."""
    if header_length is None:
        header, binary = body, b""
    else:
        header, binary = body[:header_length], body[header_length:]
    try:
        request = _DECODER.decode(header.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"the request is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("the request's JSON nests arrays or objects too deeply") from None
    if not isinstance(request, dict):
        raise ProtocolError("the request must be a JSON object")
    specs = _list(request, "inputs", required=True)
    parameters = _parameters(request, "the request")
    arrays: dict[str, np.ndarray] = {}
    shared: dict[str, SharedInput] = {}
    offset = 0
    all_binary = True
    for spec in specs:
        start = offset
        name, array, offset = _decode_input(spec, inputs, binary, offset)
        if name in arrays or name in shared:
            raise ProtocolError(f"input {name!r} is given twice")
        if isinstance(array, SharedInput):
            shared[name] = array
        else:
            arrays[name] = array
        all_binary = all_binary and offset > start and inputs[name] != "BYTES"
    if offset != len(binary):
        raise ProtocolError(
            f"the binary inputs take {offset} bytes, but {len(binary)} follow the JSON header"
        )
    missing = [name for name in inputs if name not in arrays and name not in shared]
    if missing:
        raise ProtocolError(f"missing input(s) {', '.join(map(repr, missing))}")
    binary_output = bool(parameters.get("binary_data_output", False))
    requested = []
    for spec in _list(request, "outputs", required=False):
        name = _name(spec, "output")
        wants = _parameters(spec, f"output {name!r}")
        if "classification" in wants:
            raise ProtocolError(f"output {name!r}: the classification extension is not supported")
        region = SharedMemoryRef.from_parameters(wants, f"output {name!r}")
        wants_binary = bool(wants.get("binary_data", binary_output))
        requested.append(RequestedOutput(name, wants_binary, region))
    # No output named ("outputs" absent, null or []): every output, as Triton does.
    outputs = requested or None
    request_id = request.get("id")
    decoded = InferenceRequest(
        None if request_id is None else str(request_id),
        parameters,
        arrays,
        outputs,
        binary_output,
        shared,
    )
    return decoded, all_binary


def _list(request: Mapping[str, Any], key: str, required: bool) -> list[Any]:
    value = request.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise ProtocolError(f"the request needs {key!r}: a non-empty list of tensors")
    return value


def _parameters(spec: Any, what: str) -> dict[str, Any]:
    parameters = spec.get("parameters", {}) if isinstance(spec, dict) else {}
    if not isinstance(parameters, dict):
        raise ProtocolError(f"the parameters of {what} must be a JSON object")
    return parameters


def _name(spec: Any, kind: str) -> str:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ProtocolError(f"each {kind} must be a JSON object with a string 'name'")
    return str(spec["name"])


def _decode_input(
    spec: Any, inputs: Mapping[str, str], binary: bytes, offset: int
) -> tuple[str, np.ndarray | SharedInput, int]:
    name = _name(spec, "input")
    expected = inputs.get(name)
    if expected is None:
        known = ", ".join(map(repr, inputs)) or "none"
        raise ProtocolError(f"the model has no input named {name!r}; its inputs are {known}")
    given = spec.get("datatype")
    if given != expected:
        raise ProtocolError(f"input {name!r}: datatype {given!r} given, the model takes {expected}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(
            f"input {name!r}: 'shape' must be a list of integers >= 0, got {shape!r}"
        )
    if len(shape) > MAX_RANK:
        raise ProtocolError(
            f"input {name!r}: 'shape' has {len(shape)} dimensions, at most {MAX_RANK} are supported"
        )
    if math.prod(d or 1 for d in shape) > MAX_ELEMENTS:
        raise ProtocolError(f"input {name!r}: 'shape' {shape} is too large")
    count = math.prod(shape)
    parameters = _parameters(spec, f"input {name!r}")
    region = SharedMemoryRef.from_parameters(parameters, f"input {name!r}")
    if region is not None:  # read by the service from the region
        return name, SharedInput(region, expected, tuple(shape)), offset
    size = parameters.get("binary_data_size")
    if size is not None:
        if (
            not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or offset + size > len(binary)
        ):
            raise ProtocolError(
                f"input {name!r}: binary_data_size {size!r} does not fit the "
                f"{len(binary) - offset} binary bytes left"
            )
        chunk = binary[offset : offset + size]
        array = tensor_from_bytes(name, chunk, expected, count)
        offset += size
    elif "data" in spec:
        array = from_json(name, spec["data"], expected, count)
    else:
        raise ProtocolError(f"input {name!r} has neither 'data' nor binary_data_size")
    return name, array.reshape(shape), offset


def tensor_from_bytes(name: str, chunk: bytes, kind: str, count: int) -> np.ndarray:
    """The ``count`` elements of input ``name`` (datatype ``kind``) in the binary
    little-endian layout of the protocol (BYTES: a 4-byte length before each element);
    both transports read tensors with it.

    Raises:
        ProtocolError: the bytes do not hold ``count`` elements of ``kind``.
    """
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


def encode_infer_response(
    model: str,
    version: str,
    request_id: str | None,
    outputs: Sequence[tuple[str, np.ndarray, bool]],
    parameters: Mapping[str, Any] | None = None,
    shared: Mapping[str, SharedMemoryRef] | None = None,
) -> tuple[bytes, int | None]:
    """The response body for ``outputs`` (name, array, binary) and the JSON part's length
    when some output is binary (for ``Inference-Header-Content-Length``), else None.
    The outputs in ``shared`` were written to shared memory: their entries give the
    datatype, shape and region, no data.

    Raises:
        ProtocolError: a BYTES output asked for as JSON holds bytes that are not UTF-8.
    """
    # Lists, not generators, for the few outputs of a response: cheaper on the hot path.
    if (
        outputs
        and not parameters
        and not shared
        and all([binary and array.dtype.kind not in "OSU" for _, array, binary in outputs])
    ):
        chunks = [tensor_to_bytes(array) for _, array, _ in outputs]
        layout = tuple(
            [
                (name, array.dtype, array.shape, len(chunk))
                for (name, array, _), chunk in zip(outputs, chunks)
            ]
        )
        header = _binary_header(model, version, request_id, layout)
        return b"".join([header, *chunks]), len(header)
    entries: list[dict[str, Any]] = []
    chunks = []
    floats = []
    for name, array, binary in outputs:
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype(array.dtype),
            "shape": list(array.shape),
        }
        region = shared.get(name) if shared else None
        if region is not None:
            entry["parameters"] = _region_parameters(region, array)
        elif binary:
            chunk = tensor_to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = to_json(name, array)
            if array.dtype.kind == "f":
                floats.append((entry, array))
        entries.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = dict(parameters)
    response["outputs"] = entries
    try:
        text = _ENCODER.encode(response)
    except ValueError:  # NaN or an infinity (found only when there is one: they are rare)
        for entry, array in floats:
            spell_special_floats(entry["data"], array.reshape(-1))
        text = _ENCODER.encode(response)
    header = text.encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def _region_parameters(region: SharedMemoryRef, array: np.ndarray) -> dict[str, Any]:
    size = len(tensor_to_bytes(array)) if array.dtype.kind in "OSU" else array.nbytes
    parameters: dict[str, Any] = {
        "shared_memory_region": region.region,
        "shared_memory_byte_size": size,
    }
    if region.offset:
        parameters["shared_memory_offset"] = region.offset
    return parameters


@functools.lru_cache(maxsize=256)
def _binary_header(
    model: str,
    version: str,
    request_id: str | None,
    layout: tuple[tuple[str, np.dtype, tuple[int, ...], int], ...],
) -> bytes:
    """The JSON header of a response whose outputs (name, dtype, shape, byte size) are
    all binary; cached: a client asking again gets the same header."""
    response: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = [
        {
            "name": name,
            "datatype": datatype(dtype),
            "shape": list(shape),
            "parameters": {"binary_data_size": size},
        }
        for name, dtype, shape, size in layout
    ]
    return _ENCODER.encode(response).encode()


def tensor_to_bytes(array: np.ndarray) -> bytes:
    """``array`` in the binary little-endian layout of the protocol (BYTES: a 4-byte
    length before each element)."""
    if array.dtype.kind in "OSU":  # BYTES
        parts = []
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()
