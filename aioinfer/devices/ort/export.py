"""The ORT device's export payload: onnxruntime's optimized graph and the version that
made it.

A payload is::

    meta length (u32) | meta (JSON: {"onnxruntime": version}) | ONNX model

The model is onnxruntime's graph at the ``EXTENDED`` level (see
:meth:`.session.SessionSpec.optimized_model`); it may hold ``com.microsoft`` fused
operators that another onnxruntime version does not have, or has with other semantics,
so a payload imports only into the onnxruntime version that wrote it. The model goes
through the same checks as every ONNX payload (:mod:`aioinfer.plugin.onnx_payload`): no
external data, a well-formed graph.
"""

from __future__ import annotations

import json
import struct

import onnxruntime as ort

from aioinfer.devices.ort.session import ModelBytes
from aioinfer.errors import BlobVersionError, InvalidBlobError
from aioinfer.plugin.onnx_payload import read_onnx_payload

_LENGTH = struct.Struct("<I")


def ort_payload(optimized_model: bytes) -> bytes:
    """The payload of an optimized model, written by this onnxruntime."""
    meta = json.dumps({"onnxruntime": ort.__version__}).encode()
    return b"".join((_LENGTH.pack(len(meta)), meta, optimized_model))


def read_ort_payload(payload: bytes | memoryview, name: str) -> tuple[ModelBytes, list[str]]:
    """The model of a payload of :func:`ort_payload`, checked, and its input names.

    Raises:
        InvalidBlobError: a malformed payload, or a model that does not parse, names
            external data or is malformed (see
            :func:`aioinfer.plugin.onnx_payload.read_onnx_payload`).
        BlobVersionError: written by another onnxruntime version.
    """
    view = memoryview(payload)
    if len(view) < _LENGTH.size:
        raise InvalidBlobError(f"corrupted blob: its ORT payload has {len(view)} bytes")
    (size,) = _LENGTH.unpack_from(view)
    end = _LENGTH.size + size
    if end > len(view):
        raise InvalidBlobError(
            f"corrupted blob: its ORT payload's header needs {end} bytes, it has {len(view)}"
        )
    try:
        meta = json.loads(bytes(view[_LENGTH.size : end]))
    except (ValueError, RecursionError) as exc:
        raise InvalidBlobError(
            f"corrupted blob: its ORT payload's header is not JSON ({exc})"
        ) from None
    version = meta.get("onnxruntime") if isinstance(meta, dict) else None
    if not isinstance(version, str):
        raise InvalidBlobError(
            f"corrupted blob: its ORT payload's header is {meta!r}, expected "
            '{"onnxruntime": "<version>"}'
        )
    if version != ort.__version__:
        raise BlobVersionError(
            f"the blob's model was optimized by onnxruntime {version}, this is "
            f"onnxruntime {ort.__version__}: export (or compile) the model again"
        )
    model = view[end:]
    graph = read_onnx_payload(model).graph
    inputs = [str(value.name) for value in graph.inputs if value.name not in graph.initializers]
    return ModelBytes(graph.name or name, bytes(model)), inputs
