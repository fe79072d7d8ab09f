"""The export blob: one framing, shared by every device, around a device's own payload.

A blob is::

    magic b"AIOINFER" | format version (u16) | header length (u32) | header (JSON)
    | payload length (u64) | payload (the device's bytes) | SHA-256 of everything before

The header holds the aioinfer version, the device, the compile config and the ports of
the source model; the payload is whatever the device needs to rebuild its compiled model
without compiling again (the CPU device: its transformed ONNX graph; an engine: the
engine's own serialisation). All integers are little endian.

The framing checks what any device needs checked before its payload is touched: the
magic, the format and aioinfer versions, the length, the checksum, the device, and every
header field (a crafted header raises ``InvalidBlobError``, never a ``KeyError`` or a
``TypeError`` from deep inside an import). The checksum detects damage; it is not a
signature: anyone can compute it, so blobs must come from a trusted place.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from aioinfer._version import __version__
from aioinfer.errors import BlobDeviceError, BlobVersionError, InvalidBlobError
from aioinfer.model import PORT_KINDS, Port

MAGIC = b"AIOINFER"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sHI")
_LENGTH = struct.Struct("<Q")
_DIGEST = 32


def aioinfer_version() -> str:
    """The version written into blobs (and into the model cache's keys)."""
    return __version__


@dataclass(frozen=True)
class ExportedModel:
    """What a blob holds."""

    device: str
    config: dict[str, Any]
    """The config the model was compiled with (JSON values), without ``CACHE_DIR``."""
    inputs: list[Port]
    """The source model's ports (what the model cache compares with the model it is
    asked to compile)."""
    outputs: list[Port]
    payload: bytes | memoryview
    """The device's own bytes."""
    aioinfer_version: str = field(default_factory=aioinfer_version)


def dump(exported: ExportedModel) -> bytes:
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
    body = b"".join(
        (
            _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)),
            header,
            _LENGTH.pack(len(exported.payload)),
            exported.payload,
        )
    )
    return body + hashlib.sha256(body).digest()


def is_blob(data: bytes) -> bool:
    """Whether ``data`` (a blob, or its first bytes) starts as an export blob does."""
    return data[: len(MAGIC)] == MAGIC


def load(data: bytes, device: str | None) -> ExportedModel:
    """Parse and check a blob exported for ``device`` (None: for any device); the payload
    is a view of ``data`` (nothing is copied).

    Raises:
        InvalidBlobError: not a blob (no magic), truncated, or corrupted (checksum, a
            malformed header).
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
            f"({aioinfer_version()}) reads version {FORMAT_VERSION}: export the model again"
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
    if header["aioinfer_version"] != aioinfer_version():
        raise BlobVersionError(
            f"the blob was exported by aioinfer {header['aioinfer_version']}, this is "
            f"{aioinfer_version()}: export (or compile) the model again"
        )
    if device is not None and header["device"] != device:
        raise BlobDeviceError(
            f"the blob was exported for device {header['device']!r}, not {device!r}"
        )
    return ExportedModel(
        device=header["device"],
        config=header["config"],
        inputs=[_port_from_json(i, p, "input") for i, p in enumerate(header["inputs"])],
        outputs=[_port_from_json(i, p, "output") for i, p in enumerate(header["outputs"])],
        payload=blob[payload_at : payload_at + payload_size],
        aioinfer_version=header["aioinfer_version"],
    )


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


_DATA_TYPES = frozenset(int(t) for t in ir.DataType if t != ir.DataType.UNDEFINED)


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
        index, name, ir.DataType(element_type), None if shape is None else tuple(shape), kind
    )
