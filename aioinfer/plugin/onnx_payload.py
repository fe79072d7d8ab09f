"""An ONNX model as an export payload (what the CPU device stores, and any device whose
compiled form is an ONNX graph).

A payload is self-contained: :func:`onnx_payload` writes every weight into it, and
:func:`read_onnx_payload` refuses one whose tensor names external data without opening
the file (a crafted blob could otherwise make the importer read any file it can open
and hand its bytes back as model output).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError, Message

from aioinfer.errors import InvalidBlobError, InvalidModelError
from aioinfer.frontend import check_ir_model, deserialize


def onnx_payload(model: ir.Model) -> bytes:
    """``model`` serialized with its weights (those kept in external data files are read
    into it first: a payload must stand alone)."""
    ir.external_data.load_to_model(model)
    return ir.serde.serialize_model(model).SerializeToString()


def read_onnx_payload(payload: bytes | memoryview) -> ir.Model:
    """The model of a payload of :func:`onnx_payload`, checked.

    Raises:
        InvalidBlobError: it does not parse, a tensor names external data (the file is
            never opened), or the graph is malformed (a cycle, an undefined value).
    """
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(payload)
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
    return model


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
