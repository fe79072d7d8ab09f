"""The ONNX frontend: files, bytes and protos become onnx-ir models, with clear errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from aioinfer.errors import InvalidModelError, ModelNotFoundError

ModelSource = (
    str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | onnx.ModelProto | ir.Model
)


def read_ir_model(source: ModelSource) -> ir.Model:
    """Read ``source`` into an onnx-ir model, checking it with ONNX's checker.

    Raises:
        ModelNotFoundError: the path does not exist.
        InvalidModelError: not an ONNX model, truncated, or rejected by the checker.
    """
    if isinstance(source, ir.Model):
        return source
    if isinstance(source, onnx.ModelProto):
        _check(source, "the given ModelProto")
        return ir.serde.deserialize_model(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        proto = _parse(bytes(source), f"the given bytes ({len(source)} bytes)")
        _check(proto, "the given bytes")
        return ir.serde.deserialize_model(proto)
    if isinstance(source, (str, os.PathLike)):
        return _read_path(Path(source))
    if callable(getattr(source, "read", None)):
        return _read_file_object(source)
    raise TypeError(
        "read_model takes a path, bytes, a binary file object, an onnx.ModelProto or an "
        f"onnx_ir.Model, not {type(source).__name__}"
    )


def read_stream(stream: Any, what: str) -> bytes:
    """The bytes of a binary stream (a file opened with ``"rb"``, an ``io.BytesIO``) from
    its current position to its end. A seekable stream with nothing left to read is read
    from its start: a stream just written (``export_model(stream)``, ``onnx.save(model,
    stream)``) is at its end, and what was written is what the caller means.

    Raises:
        TypeError: ``read()`` returned text, not bytes (``what`` names the stream's use).
    """
    data = stream.read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"{what} takes a binary stream (open files with 'rb'); its read() returned "
            f"{type(data).__name__}"
        )
    seekable = getattr(stream, "seekable", None)
    if not data and callable(seekable) and seekable():
        stream.seek(0)
        data = stream.read()
    return bytes(data)


def _read_file_object(stream: Any) -> ir.Model:
    data = read_stream(stream, "read_model")
    # An open file: external data is found next to it, as for a path.
    name = getattr(stream, "name", None)
    path = Path(name) if isinstance(name, str) and os.path.isfile(name) else None
    what = f"model file {name!r}" if path is not None else f"the given stream ({len(data)} bytes)"
    return _from_bytes(data, what, path)


def _read_path(path: Path) -> ir.Model:
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {str(path)!r}")
    if path.is_dir():
        raise InvalidModelError(f"{str(path)!r} is a directory, not an ONNX model file")
    return _from_bytes(path.read_bytes(), f"model file {str(path)!r}", path)


def _from_bytes(data: bytes, what: str, path: Path | None) -> ir.Model:
    proto = _parse(data, what)
    _check(proto, what, path)
    model = ir.serde.deserialize_model(proto)
    if path is not None:
        # External data paths are relative to the model file.
        ir.external_data.set_base_dir(model.graph, str(path.parent))
    return model


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    if not data:
        raise InvalidModelError(f"{what} is empty")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(
            f"{what} is not an ONNX model, or it is truncated or corrupted ({exc})"
        ) from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise InvalidModelError(
            f"{what} is not an ONNX model (no graph or IR version); is it truncated?"
        )
    return proto


def _check(proto: onnx.ModelProto, what: str, path: Path | None = None) -> None:
    try:
        if path is not None and _uses_external_data(proto):
            onnx.checker.check_model(str(path))
        else:
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        raise InvalidModelError(f"{what} is not a valid ONNX model: {first}") from None


def _uses_external_data(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
