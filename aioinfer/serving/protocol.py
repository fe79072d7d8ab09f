"""The Open Inference Protocol (KServe v2) on the wire: tensors in JSON and binary form.

An infer request body is a JSON header, optionally followed by raw tensor bytes (the
binary tensor data extension): the ``Inference-Header-Content-Length`` HTTP header gives
the JSON part's length, and each input with ``parameters.binary_data_size`` takes that
many bytes from the rest, in input order. Responses use the same layout for outputs asked
for in binary form (``parameters.binary_data`` per output, or ``binary_data_output`` for
the whole request).

Tensors in JSON are checked, not coerced: an integer out of its datatype's range, a
fraction in integer data, ``null`` or a string in numeric data, a number beyond FP16/FP32
range are refused (400) rather than wrapped, truncated or turned into NaN/infinity. NaN
and the infinities have no JSON literal: outputs write them as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``, and inputs accept those strings (and the bare
literals Python's ``json`` and Triton write). The checks run on whole arrays (numpy
reductions); only data that mixes those strings (or ``null``...) with numbers is looked
at element by element.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioinfer.model import Port

HEADER_LENGTH = b"inference-header-content-length"
"""The HTTP header that gives the JSON part's length of a body with binary tensors."""

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
"""Protocol datatype -> numpy dtype (``BYTES``: an object array of strings)."""

_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
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

SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How JSON data writes the floats that JSON has no number for (inputs and outputs)."""


class ProtocolError(Exception):
    """A request the server answers with an HTTP error ``status`` and ``{"error": ...}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def datatype(dtype: np.dtype) -> str:
    """The protocol datatype of a numpy dtype (strings are ``BYTES``).

    Raises:
        ProtocolError: no protocol datatype for it.
    """
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ProtocolError(
            f"element type {dtype} has no Open Inference Protocol datatype"
        ) from None


def port_metadata(port: Port) -> dict[str, Any]:
    """``{"name", "datatype", "shape"}`` of a model port; -1 marks a dynamic dimension."""
    shape = [-1] if port.shape is None else [d if isinstance(d, int) else -1 for d in port.shape]
    return {"name": port.name, "datatype": datatype(port.dtype), "shape": shape}


@dataclass
class RequestedOutput:
    """An output a request asks for, and whether it wants it as binary data."""

    name: str
    binary: bool


@dataclass
class InferRequestBody:
    """A decoded infer request."""

    id: str | None
    parameters: dict[str, Any]
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None
    """The outputs asked for (None: every output)."""
    binary_output: bool
    """The default for outputs not asked for by name (``binary_data_output``)."""


def parse_infer_request(
    body: bytes, header_length: str | None, inputs: Mapping[str, str]
) -> InferRequestBody:
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

    request: InferRequestBody
    """The header's fields (with no ``inputs``)."""
    inputs: tuple[tuple[str, np.dtype, np.dtype, tuple[int, ...], int], ...]
    """Per input, in body order: name, wire dtype, numpy dtype, shape, byte size."""
    size: int
    """The bytes that follow the header."""

    def decode(self, body: bytes, offset: int) -> InferRequestBody:
        arrays: dict[str, np.ndarray] = {}
        for name, wire, native, shape, size in self.inputs:
            array = np.frombuffer(body, wire, size // wire.itemsize, offset)
            arrays[name] = array.astype(native, copy=False).reshape(shape)
            offset += size
        request = self.request
        return InferRequestBody(
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

    def decode(self, body: bytes, header_length: str | None) -> InferRequestBody:
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

    def _remember(self, header: bytes, request: InferRequestBody) -> None:
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
) -> tuple[InferRequestBody, bool]:
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
    offset = 0
    all_binary = True
    for spec in specs:
        start = offset
        name, array, offset = _decode_input(spec, inputs, binary, offset)
        if name in arrays:
            raise ProtocolError(f"input {name!r} is given twice")
        arrays[name] = array
        all_binary = all_binary and offset > start and inputs[name] != "BYTES"
    if offset != len(binary):
        raise ProtocolError(
            f"the binary inputs take {offset} bytes, but {len(binary)} follow the JSON header"
        )
    missing = [name for name in inputs if name not in arrays]
    if missing:
        raise ProtocolError(f"missing input(s) {', '.join(map(repr, missing))}")
    binary_output = bool(parameters.get("binary_data_output", False))
    requested = []
    for spec in _list(request, "outputs", required=False):
        name = _name(spec, "output")
        wants = _parameters(spec, f"output {name!r}")
        if "classification" in wants:
            raise ProtocolError(f"output {name!r}: the classification extension is not supported")
        requested.append(RequestedOutput(name, bool(wants.get("binary_data", binary_output))))
    # No output named ("outputs" absent, null or []): every output, as Triton does.
    outputs = requested or None
    request_id = request.get("id")
    decoded = InferRequestBody(
        None if request_id is None else str(request_id), parameters, arrays, outputs, binary_output
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
) -> tuple[str, np.ndarray, int]:
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
    size = _parameters(spec, f"input {name!r}").get("binary_data_size")
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
        array = _from_bytes(name, chunk, expected, count)
        offset += size
    elif "data" in spec:
        array = _from_json(name, spec["data"], expected, count)
    else:
        raise ProtocolError(f"input {name!r} has neither 'data' nor binary_data_size")
    return name, array.reshape(shape), offset


def _from_bytes(name: str, chunk: bytes, kind: str, count: int) -> np.ndarray:
    if kind == "BYTES":
        items = _unpack_bytes(name, chunk)
        if len(items) != count:
            raise ProtocolError(f"input {name!r}: {len(items)} strings for {count} elements")
        return _objects(items)
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


def _from_json(name: str, data: Any, kind: str, count: int) -> np.ndarray:
    if kind == "BYTES":
        flat = _strings(name, data)
    else:
        try:
            values = np.asarray(data)  # numpy picks int64, uint64, float64, bool or else
        except ValueError as exc:  # ragged nesting, too many dimensions
            raise ProtocolError(f"input {name!r}: 'data' is not {kind} values ({exc})") from None
        flat = _numbers(name, values.reshape(-1), data, kind)
    if flat.size != count:
        raise ProtocolError(
            f"input {name!r}: {flat.size} values in 'data', the shape needs {count}"
        )
    return flat


def _numbers(name: str, flat: np.ndarray, data: Any, kind: str) -> np.ndarray:
    """``flat`` (numpy's reading of the JSON ``data``) as ``kind``, or the error naming
    the first element that is not a value of ``kind``."""
    dtype = DATATYPES[kind]
    source = flat.dtype.kind
    if not flat.size:
        return flat.astype(dtype)
    if kind == "BOOL":
        if source != "b":
            objects = np.asarray(data, dtype=object).reshape(-1).tolist()
            index = next(i for i, item in enumerate(objects) if type(item) is not bool)
            raise _not_a(name, kind, index, objects[index])
        return flat
    if source not in "iuf":  # strings, null, booleans, integers beyond 64 bits, a mix
        return _mixed(name, np.asarray(data, dtype=object).reshape(-1), kind)
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            array = flat.astype(dtype)
        # Only floats (JSON numbers such as 1e999 parse as infinity) and integers into
        # FP16 can become infinite.
        if source == "f" or dtype.itemsize == 2:
            finite = np.isfinite(array)
            if not finite.all():
                raise _out_of_range(name, kind, int(np.argmin(finite)), flat)
        return array
    if flat.dtype == dtype:  # int64 or uint64 as numpy read them: in range
        return flat
    if source == "i":  # numpy's int64, the common case: in range if the cast keeps it
        array = flat.astype(dtype)
        if (array != flat).any():
            info = np.iinfo(dtype)
            values = flat.tolist()
            index = next(i for i, v in enumerate(values) if not info.min <= v <= info.max)
            raise _out_of_range(name, kind, index, values)
        return array
    low, high = flat.min().item(), flat.max().item()
    if source == "f":
        fraction = np.trunc(flat) != flat
        if fraction.any():
            index = int(np.argmax(fraction))
            raise _not_a(name, kind, index, flat[index])
        if max(-low, high) > 2**53:
            # Integers that numpy read as float64 (values on both sides of 2**63, or
            # next to fractional notation) may have lost digits: take JSON's own.
            return _mixed(name, np.asarray(data, dtype=object).reshape(-1), kind)
    info = np.iinfo(dtype)
    if low < info.min or high > info.max:
        values = flat.tolist()
        index = next(i for i, v in enumerate(values) if not info.min <= v <= info.max)
        raise _out_of_range(name, kind, index, values)
    return flat.astype(dtype)


def _mixed(name: str, objects: np.ndarray, kind: str) -> np.ndarray:
    """The slow path of :func:`_numbers`: element by element, for data that is not all
    numbers (the strings of :data:`SPECIAL_FLOATS` among them)."""
    dtype = DATATYPES[kind]
    floating = dtype.kind == "f"
    items = objects.tolist()
    for index, item in enumerate(items):
        if type(item) is int or (type(item) is float and (floating or item.is_integer())):
            continue
        if floating and type(item) is str and item in SPECIAL_FLOATS:
            items[index] = SPECIAL_FLOATS[item]
            continue
        raise _not_a(name, kind, index, item)
    if floating:
        wide = np.empty(len(items), np.float64)
        for index, item in enumerate(items):
            try:
                wide[index] = item
            except OverflowError:  # an integer beyond float64
                raise _out_of_range(name, kind, index, items) from None
        with np.errstate(over="ignore"):
            array = wide.astype(dtype)
        overflow = np.isfinite(wide) & ~np.isfinite(array)
        if overflow.any():
            raise _out_of_range(name, kind, int(np.argmax(overflow)), items)
        return array
    info = np.iinfo(dtype)
    for index, item in enumerate(items):
        if not info.min <= item <= info.max:
            raise _out_of_range(name, kind, index, items)
    return np.array([int(item) for item in items], dtype=dtype)


def _out_of_range(name: str, kind: str, index: int, values: Any) -> ProtocolError:
    value = values[index]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        shown = "a number beyond the range of FP64"  # e.g. 1e999, which parses as infinity
    else:
        shown = str(value)
        if len(shown) > 40:
            shown = f"{shown[:20]}... ({len(shown)} digits)"
    dtype = DATATYPES[kind]
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    return ProtocolError(
        f"input {name!r}: element {index} of 'data' is {shown}, out of the range of {kind} "
        f"[{info.min!s}, {info.max!s}]"
    )


_EXPECTED = {"BOOL": "true or false", "BYTES": "a string", "f": "a number", "iu": "an integer"}


def _not_a(name: str, kind: str, index: int, item: Any) -> ProtocolError:
    if isinstance(item, np.generic):
        item = item.item()
    shown = json.dumps(item) if isinstance(item, (str, bool)) or item is None else repr(item)
    if len(shown) > 40:
        shown = shown[:40] + "..."
    expected = _EXPECTED.get(kind) or _EXPECTED["f" if kind.startswith("FP") else "iu"]
    if kind.startswith("FP"):
        expected = 'a number, "NaN", "Infinity" or "-Infinity"'
    return ProtocolError(
        f"input {name!r}: element {index} of 'data' is {shown}, not {expected} ({kind})"
    )


def _strings(name: str, data: Any) -> np.ndarray:
    """The strings of the JSON ``data`` of a BYTES input (nested lists flattened)."""
    items: list[Any] = []
    pending = [iter(data if isinstance(data, list) else [data])]
    while pending:
        for item in pending[-1]:
            if isinstance(item, list):
                pending.append(iter(item))
                break
            items.append(item)
        else:
            pending.pop()
    for index, item in enumerate(items):
        if type(item) is not str:
            raise _not_a(name, "BYTES", index, item)
    try:
        "".join(items).encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON)
        index = next(i for i, item in enumerate(items) if not _is_unicode(item))
        raise ProtocolError(
            f"input {name!r}: element {index} ({items[index]!r}) is not valid Unicode text"
        ) from None
    return _objects(items)


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _objects(items: list[Any]) -> np.ndarray:
    """A 1-D object array of ``items`` (numpy would split equal-length strings)."""
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def encode_infer_response(
    model: str,
    version: str,
    request_id: str | None,
    outputs: Sequence[tuple[str, np.ndarray, bool]],
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """The response body for ``outputs`` (name, array, binary) and the JSON part's length
    when some output is binary (for ``Inference-Header-Content-Length``), else None.

    Raises:
        ProtocolError: a BYTES output asked for as JSON holds bytes that are not UTF-8.
    """
    if (
        outputs
        and not parameters
        and all(binary and array.dtype.kind not in "OSU" for _, array, binary in outputs)
    ):
        chunks = [_to_bytes(array) for _, array, _ in outputs]
        layout = tuple(
            (name, array.dtype, array.shape, len(chunk))
            for (name, array, _), chunk in zip(outputs, chunks)
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
        if binary:
            chunk = _to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = _to_json(name, array)
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
            _spell_special_floats(entry["data"], array.reshape(-1))
        text = _ENCODER.encode(response)
    header = text.encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


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


def _to_bytes(array: np.ndarray) -> bytes:
    if datatype(array.dtype) == "BYTES":
        parts = []
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


def _to_json(name: str, array: np.ndarray) -> list[Any]:
    flat = array.reshape(-1)
    if datatype(array.dtype) == "BYTES":
        return _texts(name, flat)
    values: list[Any] = flat.tolist()
    return values


def _spell_special_floats(values: list[Any], flat: np.ndarray) -> None:
    """Replace NaN and the infinities in ``values`` (``flat.tolist()``) by their strings."""
    for index in np.flatnonzero(~np.isfinite(flat)).tolist():
        value = values[index]
        values[index] = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


def _texts(name: str, flat: np.ndarray) -> list[str]:
    texts = []
    for index, item in enumerate(flat):
        if isinstance(item, bytes):
            try:
                item = item.decode()
            except UnicodeDecodeError:
                raise ProtocolError(
                    f"output {name!r}: element {index} ({item[:20]!r}) is not UTF-8 text, "
                    "which JSON cannot carry; ask for it as binary data "
                    "(parameters.binary_data)"
                ) from None
        texts.append(item if isinstance(item, str) else str(item))
    return texts
