"""The ONNX frontend: files, bytes and protos become onnx-ir models, with clear errors.

Whatever the source, a model that is not one (garbage, truncated, invalid UTF-8 in a
name, a cycle, a value read but never defined, a name defined twice, nesting too deep
to walk) raises :class:`InvalidModelError`; no parser's or checker's own exception
leaks out.
"""

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
    """Read ``source`` into an onnx-ir model, checking it with ONNX's checker (an
    ``onnx_ir.Model`` is checked for cycles, undefined inputs and duplicate names).

    Raises:
        ModelNotFoundError: the path does not exist.
        InvalidModelError: not an ONNX model, truncated, or rejected by the checks.
    """
    if isinstance(source, ir.Model):
        check_ir_model(source, "the given onnx_ir.Model")
        return source
    if isinstance(source, onnx.ModelProto):
        return _from_proto(source, "the given ModelProto")
    if isinstance(source, (bytes, bytearray, memoryview)):
        what = f"the given bytes ({len(source)} bytes)"
        return _from_proto(_parse(bytes(source), what), what)
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
    model = _from_proto(_parse(data, what), what, path)
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


def _from_proto(proto: onnx.ModelProto, what: str, path: Path | None = None) -> ir.Model:
    _check(proto, what, path)
    model = deserialize(proto, what)
    check_ir_model(model, what)  # ONNX's checker lets invalid UTF-8 in names through
    return model


def deserialize(proto: onnx.ModelProto, what: str) -> ir.Model:
    """``proto`` as an onnx-ir model.

    Raises:
        InvalidModelError: onnx-ir cannot represent it (the message gives onnx-ir's
            reason, e.g. a name declared twice).
    """
    try:
        return ir.serde.deserialize_model(proto)
    except RecursionError:
        raise InvalidModelError(f"{what} nests its subgraphs too deeply to read") from None
    except (ValueError, TypeError, LookupError, RuntimeError) as exc:  # SerdeError: Runtime
        reason: BaseException = exc
        while reason.__cause__ is not None:  # SerdeError wraps the reason per level
            reason = reason.__cause__
        raise InvalidModelError(f"{what} cannot be read: {reason}") from exc


def _check(proto: onnx.ModelProto, what: str, path: Path | None = None) -> None:
    try:
        if path is not None and _uses_external_data(proto):
            onnx.checker.check_model(str(path))
        else:
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        raise InvalidModelError(f"{what} is not a valid ONNX model: {first}") from None
    except UnicodeDecodeError:
        # The checker's message quotes the offending string and cannot be decoded itself.
        raise InvalidModelError(
            f"{what} is not a valid ONNX model: a name or string field is not valid UTF-8"
        ) from None
    except RecursionError:
        raise InvalidModelError(f"{what} nests its subgraphs too deeply to check") from None


def _uses_external_data(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def check_ir_model(model: ir.Model, what: str) -> None:
    """Check the structure of ``model``'s graphs as ONNX's checker would, on the IR
    (serializing a large model to check it would copy its weights): each name defined
    once and valid UTF-8, every value read defined, no cycle.

    Raises:
        InvalidModelError: names ``what``, the graph and the fault.
    """
    try:
        _check_graph(model.graph, frozenset(), what)
    except RecursionError:
        raise InvalidModelError(f"{what} nests its subgraphs too deeply to check") from None


def _check_graph(graph: ir.Graph, outer: frozenset[ir.Value], what: str) -> None:
    """``graph`` defines each name once, reads only values defined in it or in an
    enclosing graph (``outer``), and has no cycle; the same for its subgraphs."""
    where = f"{what}, graph {graph.name!r}"
    nodes = list(graph)
    values = [
        *graph.inputs,
        *graph.initializers.values(),
        *(out for node in nodes for out in node.outputs),
    ]
    defined: dict[str, ir.Value] = {}
    for value in values:
        if value.name and defined.setdefault(value.name, value) is not value:
            raise InvalidModelError(f"{where}: the name {value.name!r} is defined twice")
    members = set(nodes)
    visible = outer | set(values)
    for text in (
        graph.name,
        *(value.name for value in values),
        *(text for node in nodes for text in (node.name, node.op_type, node.domain)),
    ):
        _check_utf8(text, where)
    for node in nodes:
        for read in node.inputs:
            if read is None or read in visible:
                continue
            raise InvalidModelError(
                f"{where}: node {node.name or node.op_type!r} reads {read.name!r}, which no "
                "node, graph input or initializer defines"
            )
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _check_graph(attr.as_graph(), frozenset(visible), what)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    _check_graph(sub, frozenset(visible), what)
    _check_acyclic(nodes, members, where)
    for value in graph.outputs:
        if value not in visible:
            raise InvalidModelError(f"{where}: graph output {value.name!r} is never defined")


def _check_utf8(text: str | bytes | None, where: str) -> None:
    """Invalid UTF-8 reaches the IR as ``bytes`` (the protobuf runtime's answer for a
    string field that does not decode) or as an ``str`` with lone surrogates."""
    try:
        if isinstance(text, bytes):
            text.decode()
            raise UnicodeError  # bytes where a name belongs: not a string field at all
        if text:
            text.encode()
    except UnicodeError:
        raise InvalidModelError(f"{where}: the name {text!r} is not valid UTF-8") from None


def _check_acyclic(nodes: list[ir.Node], members: set[ir.Node], where: str) -> None:
    """Kahn's algorithm over the producer -> consumer edges inside one graph."""
    waiting = {
        node: len({v.producer() for v in node.inputs if v is not None} & members) for node in nodes
    }
    ready = [node for node, count in waiting.items() if count == 0]
    done = 0
    while ready:
        node = ready.pop()
        done += 1
        consumers = {user for out in node.outputs for user, _ in out.uses()}
        for user in consumers & members:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if done < len(nodes):
        stuck = [node.name or node.op_type for node, count in waiting.items() if count > 0]
        raise InvalidModelError(
            f"{where}: the graph has a cycle (nodes on or after it: {stuck[:5]})"
        )
