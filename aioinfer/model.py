"""Model: the user's handle on a graph before compilation, and its ports."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from aioinfer.errors import InvalidModelError, UnknownInputError

Dim = int | str | None
"""A dimension: a static size, a symbolic name, or None when unknown."""

Inputs = Mapping[Any, Any] | Sequence[Any]
"""Inputs of one inference: a dict from name (or index or Port) to array, or a list."""


def normalize_dynamic_dims(model: ir.Model) -> None:
    """Rewrite, in place, every dimension that stands for "any size" as an unknown one.

    Exporters spell a dynamic dimension in several ways: no value, a negative
    ``dim_value`` (``-1``), or a placeholder ``dim_param`` that names nothing: empty or
    without a letter (``"?"``, ``"-1"``, ``"*"``). onnxruntime accepts any size for each
    of them, and a placeholder ties no two dimensions together the way a name
    (``"batch"``) does; aioinfer makes them one spelling, an unknown dimension (None).
    Values of every graph and subgraph are rewritten, so that no pass takes ``-1`` for
    a size.
    """
    for graph in model.graphs():
        for value in [*graph.inputs, *(out for node in graph for out in node.outputs)]:
            shape = value.shape
            if shape is None or not any(_is_placeholder(d) for d in shape):
                continue
            dims = [None if _is_placeholder(d) else d for d in shape]
            denotations = [shape.get_denotation(i) for i in range(len(dims))]
            value.shape = ir.Shape(dims, denotations=denotations)


def _is_placeholder(dim: int | ir.SymbolicDim) -> bool:
    if isinstance(dim, int):
        return dim < 0
    name = dim.value
    return isinstance(name, str) and not any(ch.isalpha() for ch in name)


PORT_KINDS = ("tensor", "sequence", "optional", "optional_sequence")
"""What a port carries: a tensor (``np.ndarray``), a sequence (a list of tensors), an
optional tensor (an array or None) or an optional sequence (a list or None)."""


@dataclass(frozen=True)
class Port:
    """An input or output of a model: name, element type, partial shape and kind."""

    index: int
    name: str
    element_type: ir.DataType
    """The element type of the tensor (of the sequence's or optional's tensors)."""
    shape: tuple[Dim, ...] | None
    """Partial shape: ints are static, strings symbolic, None unknown; None if rank unknown
    (always None for a sequence or optional port)."""
    kind: str = "tensor"
    """One of :data:`PORT_KINDS`."""

    @functools.cached_property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the element type."""
        return np.dtype(self.element_type.numpy())

    @property
    def rank(self) -> int | None:
        """Number of dimensions, or None when the rank is unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        """True when the rank or any dimension is not static."""
        return self.shape is None or any(not isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "[" + ", ".join(_dim_str(d) for d in self.shape) + "]"
        text = f"{self.element_type.name.lower()}{dims}"
        if self.kind in ("sequence", "optional_sequence"):
            text = f"sequence({text})"
        if self.kind.startswith("optional"):
            text = f"optional({text})"
        return f"{self.name}: {text}"


def _dim_str(dim: Dim) -> str:
    return "?" if dim is None else str(dim)


def port_from_value(index: int, value: ir.Value) -> Port:
    """Describe an IR graph input or output as a :class:`Port`.

    Raises:
        InvalidModelError: the value has no element type, or a type other than a tensor,
            a sequence of tensors, or an optional of either.
    """
    if value.dtype is None:
        raise InvalidModelError(f"graph input/output {value.name!r} has no element type")
    kind = _port_kind(value)
    shape: tuple[Dim, ...] | None = None
    if value.shape is not None and kind == "tensor":
        shape = tuple(d if isinstance(d, int) else d.value for d in value.shape)
    return Port(index, value.name or f"port{index}", value.dtype, shape, kind)


def _port_kind(value: ir.Value) -> str:
    kind = value.type
    prefix = ""
    if isinstance(kind, ir.OptionalType):
        prefix, kind = "optional_", kind.elem_type
    if isinstance(kind, ir.SequenceType) and isinstance(kind.elem_type, ir.TensorType):
        return f"{prefix}sequence"
    if isinstance(kind, ir.TensorType):
        return prefix.rstrip("_") or "tensor"
    raise InvalidModelError(
        f"graph input/output {value.name!r} has type {kind}; supported are tensors, "
        "sequences of tensors and optionals of either"
    )


def unnamed_dim_name(port_name: str, axis: int) -> str:
    """The name that stands for dimension ``axis`` of input ``port_name`` where the model
    names none: a variable whose initial size follows that dimension (see
    :mod:`aioinfer.transforms.make_stateful`) carries it in its shape."""
    return f"{port_name}.shape[{axis}]"


def unnamed_dim_sizes(ports: Sequence[Port], values: Sequence[Any]) -> dict[str, int]:
    """The sizes ``values`` (in port order; None where not set) give to the unknown
    dimensions of ``ports``, by :func:`unnamed_dim_name`."""
    sizes: dict[str, int] = {}
    for port, value in zip(ports, values):
        if port.shape is None or not isinstance(value, np.ndarray):
            continue
        for axis, (dim, size) in enumerate(zip(port.shape, value.shape)):
            if dim is None:
                sizes[unnamed_dim_name(port.name, axis)] = size
    return sizes


def find_port(ports: Sequence[Port], key: str | int | Port, kind: str) -> Port:
    """The port named ``key`` (or at position ``key``) among ``ports``.

    Raises:
        UnknownInputError: no such port; the message lists the ports that exist.
    """
    if isinstance(key, Port):
        key = key.name
    if isinstance(key, int) and not isinstance(key, bool):
        if -len(ports) <= key < len(ports):
            return ports[key]
        raise UnknownInputError(f"the model has {len(ports)} {kind}s; there is no {kind} {key}")
    for port in ports:
        if port.name == key:
            return port
    names = ", ".join(repr(p.name) for p in ports) or "none"
    raise UnknownInputError(f"the model has no {kind} named {key!r}; its {kind}s are {names}")


def takes_strings(node: ir.Node) -> bool:
    """Whether ``node`` takes or gives a string tensor (whose type is known): the engines
    whose strings are text (or that have none) leave such nodes to devices that carry
    any bytes."""
    values = [*node.inputs, *node.outputs]
    return any(v is not None and v.dtype == ir.DataType.STRING for v in values)


def batch_problem(inputs: Sequence[Port], outputs: Sequence[Port]) -> str | None:
    """Why a model with these ports cannot be batched along its first axis (None: it can).

    Batchable means: every input and output is a tensor whose first dimension is one and
    the same symbolic dimension (``"batch"``), so rows can be joined and split back.
    """
    if not inputs:
        return "the model has no inputs"
    symbols: dict[str, str] = {}
    for kind, ports in (("input", inputs), ("output", outputs)):
        for port in ports:
            if port.kind != "tensor":
                return f"{kind} {port.name!r} is a {port.kind.replace('_', ' ')}, not a tensor"
            if not port.shape:
                rank = "unknown" if port.shape is None else "0"
                return f"{kind} {port.name!r} has rank {rank}; batching needs a first dimension"
            first = port.shape[0]
            if not isinstance(first, str):
                return (
                    f"{kind} {port.name!r} ({port}) has first dimension "
                    f"{'unknown' if first is None else first}, not a symbolic batch dimension"
                )
            symbols.setdefault(first, f"{kind} {port.name!r}")
    if len(symbols) > 1:
        which = ", ".join(f"{where}: {symbol!r}" for symbol, where in symbols.items())
        return f"the first dimensions are different symbols ({which}); batching needs one"
    return None


class HasPorts:
    """Input and output ports by name or position (a model, a compiled model)."""

    _inputs: list[Port]
    _outputs: list[Port]

    @property
    def inputs(self) -> list[Port]:
        """The inputs a user feeds (initializers listed as graph inputs are not among them)."""
        return list(self._inputs)

    @property
    def outputs(self) -> list[Port]:
        """The outputs."""
        return list(self._outputs)

    def input(self, key: str | int = 0) -> Port:
        """One input by name or position.

        Raises:
            UnknownInputError: no such input (the message lists the inputs).
        """
        return find_port(self._inputs, key, "input")

    def output(self, key: str | int = 0) -> Port:
        """One output by name or position.

        Raises:
            UnknownInputError: no such output (the message lists the outputs).
        """
        return find_port(self._outputs, key, "output")


class Model(HasPorts):
    """An ONNX model read into aioinfer's IR (onnx-ir), ready to compile.

    Obtain one with :meth:`aioinfer.Core.read_model`. ``inputs`` and ``outputs`` list the
    ports the compiled model will have; ``ir`` is the underlying :class:`onnx_ir.Model`.
    A dynamic dimension however the exporter wrote it (``-1``, ``"?"``, no value) is
    unknown (None) in both (see :func:`normalize_dynamic_dims`).
    """

    def __init__(self, ir_model: ir.Model) -> None:
        normalize_dynamic_dims(ir_model)
        self._ir = ir_model
        graph = ir_model.graph
        initializers = set(graph.initializers)
        feeds = [v for v in graph.inputs if v.name not in initializers]
        self._inputs = [port_from_value(i, v) for i, v in enumerate(feeds)]
        self._outputs = [port_from_value(i, v) for i, v in enumerate(graph.outputs)]

    @property
    def ir(self) -> ir.Model:
        """The underlying onnx-ir model (compiling copies it; the Model is not changed)."""
        return self._ir

    @property
    def name(self) -> str:
        """The graph's name."""
        return self._ir.graph.name or "model"

    def reshape(self, shapes: Mapping[str | int, Sequence[Dim]]) -> None:
        """Set new (partial) shapes for inputs, by name or position, before compiling.

        Raises:
            UnknownInputError: a key names no input.
            InvalidModelError: the new shape has a negative dimension.
        """
        feeds = {v.name: v for v in self._ir.graph.inputs}
        for key, dims in shapes.items():
            port = self.input(key)
            for d in dims:
                if isinstance(d, int) and d < 0:
                    raise InvalidModelError(f"reshape of {port.name!r}: negative dimension {d}")
            feeds[port.name].shape = ir.Shape(list(dims))
            self._inputs[port.index] = port_from_value(port.index, feeds[port.name])

    def __repr__(self) -> str:
        ins = ", ".join(str(p) for p in self._inputs)
        outs = ", ".join(str(p) for p in self._outputs)
        return f"<Model {self.name!r} inputs=({ins}) outputs=({outs})>"
