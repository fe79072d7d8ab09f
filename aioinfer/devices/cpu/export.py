"""The export format of CPU compiled models, and the model cache built on it.

A blob is::

    magic b"AIOINFER" | format version (u16) | header length (u32) | header (JSON)
    | payload length (u64) | payload (ONNX ModelProto) | SHA-256 of everything before

The header holds the aioinfer version, the device, the compile config (with the
``STATEFUL`` pairs made) and the ports of the source model; the payload is the graph
*after* the passes (fusions, folded weights, state ops), weights included. Importing
parses it and lowers it again, without running the passes. All integers are little
endian.

A blob is self-contained: its tensors hold their bytes, and :func:`load` refuses one
whose tensor names external data (a crafted blob could otherwise make the importer read
any file it can open and hand its bytes back as model output). The checksum detects
damage; it is not a signature: anyone can compute it, so blobs must come from a trusted
place.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError, Message

from aioinfer.errors import (
    BlobDeviceError,
    BlobVersionError,
    InvalidBlobError,
    InvalidModelError,
)
from aioinfer.frontend import check_ir_model, deserialize
from aioinfer.model import PORT_KINDS, Model, Port

MAGIC = b"AIOINFER"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sHI")
_LENGTH = struct.Struct("<Q")
_DIGEST = 32


@dataclass(frozen=True)
class Exported:
    """What a blob holds."""

    device: str
    aioinfer_version: str
    config: dict[str, Any]
    inputs: list[Port]
    """The source model's inputs (before make-stateful took some of them)."""
    outputs: list[Port]
    model: ir.Model
    """The transformed model."""


def _port_to_json(port: Port) -> dict[str, Any]:
    return {
        "name": port.name,
        "element_type": int(port.element_type),
        "shape": None if port.shape is None else list(port.shape),
        "kind": port.kind,
    }


def _port_from_json(index: int, data: Any, where: str) -> Port:
    """The port ``index`` of the header's ``where`` list, checked field by field."""

    def bad(what: str) -> InvalidBlobError:
        return InvalidBlobError(f"corrupted blob: {where} port {index} {what}")

    if not isinstance(data, dict):
        raise bad(f"is a JSON {type(data).__name__}, expected an object")
    name, element_type, kind = data.get("name"), data.get("element_type"), data.get("kind")
    if not isinstance(name, str):
        raise bad(f"has name {name!r}, expected a string")
    if type(element_type) is not int or element_type not in _DATA_TYPES:
        raise bad(f"has element type {element_type!r}, expected an ONNX data type number")
    if kind not in PORT_KINDS:
        raise bad(f"has kind {kind!r}, expected one of {', '.join(PORT_KINDS)}")
    shape = data.get("shape")
    if shape is not None and not (
        isinstance(shape, list)
        and all(d is None or isinstance(d, str) or (type(d) is int and d >= 0) for d in shape)
    ):
        raise bad(f"has shape {shape!r}, expected null or a list of sizes, names and nulls")
    return Port(
        index,
        name,
        ir.DataType(element_type),
        None if shape is None else tuple(shape),
        kind,
    )


_DATA_TYPES = frozenset(int(t) for t in ir.DataType if t != ir.DataType.UNDEFINED)

_HEADER_FIELDS: dict[str, type] = {
    "aioinfer_version": str,
    "device": str,
    "config": dict,
    "inputs": list,
    "outputs": list,
}


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidBlobError(f"corrupted blob: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise InvalidBlobError(
            f"corrupted blob: its header is a JSON {type(header).__name__}, expected an object"
        )
    for key, kind in _HEADER_FIELDS.items():
        if key not in header:
            raise InvalidBlobError(f"corrupted blob: its header has no {key!r}")
        if not isinstance(header[key], kind):
            raise InvalidBlobError(
                f"corrupted blob: header field {key!r} is {header[key]!r}, expected a JSON "
                f"{'object' if kind is dict else 'array' if kind is list else 'string'}"
            )
    return header


def external_tensors(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """(name, location) of every tensor in ``proto`` that keeps its bytes in external
    data: initializers, sparse ones, tensor attributes, in subgraphs and functions."""
    found = []
    pending: list[Message] = [proto]
    while pending:
        message = pending.pop()
        if isinstance(message, onnx.TensorProto):
            if message.data_location == onnx.TensorProto.EXTERNAL or message.external_data:
                entries = {e.key: e.value for e in message.external_data}
                found.append((str(message.name), str(entries.get("location", ""))))
            continue
        for field, value in message.ListFields():
            if field.message_type is None:
                continue
            if field.is_repeated:
                pending.extend(value)
            else:
                pending.append(value)
    return found


def _version() -> str:
    from aioinfer import __version__

    return __version__


def dump(exported: Exported) -> bytes:
    """The blob of ``exported``."""
    header = json.dumps(
        {
            "aioinfer_version": exported.aioinfer_version,
            "device": exported.device,
            "config": exported.config,
            "inputs": [_port_to_json(p) for p in exported.inputs],
            "outputs": [_port_to_json(p) for p in exported.outputs],
        },
        sort_keys=True,
    ).encode()
    # Weights kept in external data files go into the blob: it must stand alone.
    ir.external_data.load_to_model(exported.model)
    payload = ir.serde.serialize_model(exported.model).SerializeToString()
    body = b"".join(
        (
            _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)),
            header,
            _LENGTH.pack(len(payload)),
            payload,
        )
    )
    return body + hashlib.sha256(body).digest()


def load(data: bytes, device: str) -> Exported:
    """Parse and check a blob exported for ``device``.

    Raises:
        InvalidBlobError: not a blob (no magic), truncated, corrupted (checksum, a
            malformed header or model), or a tensor names external data (the file is
            never opened).
        BlobVersionError: another format version, or another aioinfer version.
        BlobDeviceError: exported for another device.
    """
    blob = memoryview(data)  # slices of a view copy nothing
    size = len(blob)
    if size < _PREFIX.size or blob[: len(MAGIC)] != MAGIC:
        raise InvalidBlobError(
            f"not an aioinfer export blob: expected it to start with {MAGIC!r}, "
            f"got {bytes(blob[: len(MAGIC)])!r} ({size} bytes in all)"
        )
    _, version, header_size = _PREFIX.unpack_from(blob)
    if version != FORMAT_VERSION:
        raise BlobVersionError(
            f"the blob is in export format version {version}; this aioinfer "
            f"({_version()}) reads version {FORMAT_VERSION}: export the model again"
        )
    payload_at = _PREFIX.size + header_size + _LENGTH.size
    if size < payload_at:
        raise InvalidBlobError(f"truncated blob: {size} bytes, the header alone needs {payload_at}")
    (payload_size,) = _LENGTH.unpack_from(blob, payload_at - _LENGTH.size)
    expected = payload_at + payload_size + _DIGEST
    if size != expected:
        raise InvalidBlobError(f"truncated or padded blob: expected {expected} bytes, got {size}")
    if hashlib.sha256(blob[:-_DIGEST]).digest() != bytes(blob[-_DIGEST:]):
        raise InvalidBlobError("corrupted blob: its SHA-256 checksum does not match its content")
    header = _parse_header(bytes(blob[_PREFIX.size : _PREFIX.size + header_size]))
    if header["aioinfer_version"] != _version():
        raise BlobVersionError(
            f"the blob was exported by aioinfer {header['aioinfer_version']}, this is "
            f"{_version()}: export (or compile) the model again"
        )
    if header["device"] != device:
        raise BlobDeviceError(
            f"the blob was exported for device {header['device']!r}, not {device!r}"
        )
    inputs = [_port_from_json(i, p, "input") for i, p in enumerate(header["inputs"])]
    outputs = [_port_from_json(i, p, "output") for i, p in enumerate(header["outputs"])]
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(blob[payload_at : payload_at + payload_size])
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidBlobError(f"corrupted blob: its model does not parse ({exc})") from None
    external = external_tensors(proto)
    if external:
        listed = ", ".join(f"{name!r} -> {location!r}" for name, location in external[:5])
        raise InvalidBlobError(
            f"the blob's model is not self-contained: {len(external)} tensor(s) name "
            f"external data ({listed}); a blob holds its weights itself and import "
            "never reads other files"
        )
    try:
        model = deserialize(proto, "its model")
        check_ir_model(model, "its model")
    except InvalidModelError as exc:
        raise InvalidBlobError(f"corrupted blob: {exc}") from exc
    return Exported(
        device=header["device"],
        aioinfer_version=header["aioinfer_version"],
        config=header["config"],
        inputs=inputs,
        outputs=outputs,
        model=model,
    )


def cache_key(model: Model, device: str, config: dict[str, Any]) -> str:
    """The model-cache key: a hash of the model (its nodes, ports, functions and weight
    bytes, without serializing the weights into a proto), the device, the config (without
    ``CACHE_DIR``), the aioinfer version and the export format version."""
    digest = hashlib.sha256()
    ir_model = model.ir
    graph = ir_model.graph
    digest.update(json.dumps(sorted(ir_model.opset_imports.items())).encode())
    for value in (*graph.inputs, *graph.outputs):
        digest.update(ir.serde.serialize_value(value).SerializeToString(deterministic=True))
    for node in graph:
        digest.update(ir.serde.serialize_node(node).SerializeToString(deterministic=True))
    for function in ir_model.functions.values():
        digest.update(ir.serde.serialize_function(function).SerializeToString(deterministic=True))
    for name, value in graph.initializers.items():
        tensor = value.const_value
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        if tensor is not None:
            digest.update(tensor.tobytes())
    settings = {k: v for k, v in config.items() if k != "CACHE_DIR"}
    identity = [device, settings, _version(), FORMAT_VERSION]
    digest.update(json.dumps(identity, sort_keys=True).encode())
    return digest.hexdigest()
