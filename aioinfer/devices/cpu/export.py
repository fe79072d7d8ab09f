"""The export format of CPU compiled models, and the model cache built on it.

A blob is::

    magic b"AIOINFER" | format version (u16) | header length (u32) | header (JSON)
    | payload length (u64) | payload (ONNX ModelProto) | SHA-256 of everything before

The header holds the aioinfer version, the device, the compile config (with the
``STATEFUL`` pairs made) and the ports of the source model; the payload is the graph
*after* the passes (fusions, folded weights, state ops), weights included. Importing
parses it and lowers it again, without running the passes. All integers are little
endian.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from aioinfer.errors import BlobDeviceError, BlobVersionError, InvalidBlobError
from aioinfer.model import Model, Port

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


def _port_from_json(index: int, data: dict[str, Any]) -> Port:
    shape = data["shape"]
    return Port(
        index,
        data["name"],
        ir.DataType(data["element_type"]),
        None if shape is None else tuple(shape),
        data["kind"],
    )


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
        InvalidBlobError: not a blob (no magic), truncated, or corrupted (checksum).
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
    header = json.loads(bytes(blob[_PREFIX.size : _PREFIX.size + header_size]))
    if header["aioinfer_version"] != _version():
        raise BlobVersionError(
            f"the blob was exported by aioinfer {header['aioinfer_version']}, this is "
            f"{_version()}: export (or compile) the model again"
        )
    if header["device"] != device:
        raise BlobDeviceError(
            f"the blob was exported for device {header['device']!r}, not {device!r}"
        )
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(blob[payload_at : payload_at + payload_size])
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidBlobError(f"corrupted blob: its model does not parse ({exc})") from None
    return Exported(
        device=header["device"],
        aioinfer_version=header["aioinfer_version"],
        config=header["config"],
        inputs=[_port_from_json(i, p) for i, p in enumerate(header["inputs"])],
        outputs=[_port_from_json(i, p) for i, p in enumerate(header["outputs"])],
        model=ir.serde.deserialize_model(proto),
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
