"""The kernel registry of the CPU device.

A kernel is registered with :func:`kernel` on a *factory*: a function that receives the
node as a :class:`NodeSpec` at compile time (attributes already parsed, opset known,
constant inputs visible) and returns the run-time callable. Everything that can be
decided at compile time is decided in the factory, so the returned callable only
computes. The run-time callable takes the node's inputs positionally (``None`` for an
omitted optional input) and returns a tuple with one array per node output.

Adding an operator touches one family module: write the factory, decorate it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from aioinfer.errors import UnsupportedOperatorError

Kernel = Callable[..., Sequence[Any]]
"""The run-time form of a node: ``kernel(*inputs) -> (output0, output1, ...)``."""

KernelFactory = Callable[["NodeSpec"], Kernel]


@dataclass(frozen=True)
class NodeSpec:
    """What a kernel factory knows about its node at compile time."""

    op_type: str
    domain: str
    opset: int
    """The opset version of the node's domain in the model."""
    name: str
    attrs: dict[str, Any]
    """Attribute values as Python/numpy objects (ints, floats, str, lists, ndarray, ir.Graph)."""
    num_inputs: int
    num_outputs: int
    const_inputs: tuple[np.ndarray | None, ...] = ()
    """Values of inputs known at compile time (initializers, folded constants), else None."""
    input_dtypes: tuple[np.dtype | None, ...] = ()
    """Element types of the inputs when known from the graph, else None."""
    output_dtypes: tuple[np.dtype | None, ...] = ()
    input_shapes: tuple[tuple[int | str | None, ...] | None, ...] = field(default=())
    subplans: dict[str, Any] = field(default_factory=dict)
    """Plans of the node's graph attributes, by attribute name (lowered by the compiler):
    each takes its graph's inputs followed by the node's captured values, which the
    kernel receives as extra inputs after the node's ``num_inputs``."""

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value, or ``default`` when the node does not set it."""
        return self.attrs.get(name, default)

    def const(self, index: int) -> np.ndarray | None:
        """The compile-time value of input ``index``, or None when it is not constant."""
        if index < len(self.const_inputs):
            return self.const_inputs[index]
        return None


@dataclass(frozen=True)
class KernelEntry:
    """One registered implementation of an operator, valid from ``since`` on."""

    domain: str
    op_type: str
    since: int
    factory: KernelFactory
    execution_type: str = "native"


_REGISTRY: dict[tuple[str, str], list[KernelEntry]] = {}


def kernel(
    op_type: str, *, since: int = 1, domain: str = "", execution_type: str = "native"
) -> Callable[[KernelFactory], KernelFactory]:
    """Register ``factory`` for ``op_type`` from opset version ``since`` on.

    Registering the same operator again with a higher ``since`` covers the newer
    versions; a model's opset picks the newest entry not above it, and a native entry
    over a ``"fallback"`` one of the same ``since``.
    """

    def register(factory: KernelFactory) -> KernelFactory:
        entries = _REGISTRY.setdefault((domain, op_type), [])
        entries.append(KernelEntry(domain, op_type, since, factory, execution_type))
        # For the same version a native kernel wins over a fallback (it sorts last).
        entries.sort(key=lambda e: (e.since, e.execution_type == "native"))
        return factory

    return register


def find_kernel(domain: str, op_type: str, opset: int, node_name: str = "") -> KernelEntry:
    """The entry that implements ``domain::op_type`` at ``opset``.

    Raises:
        UnsupportedOperatorError: no kernel for this operator, or none for this version.
    """
    domain = "" if domain == "ai.onnx" else domain
    entries = _REGISTRY.get((domain, op_type), [])
    chosen = [e for e in entries if e.since <= opset]
    if not chosen:
        where = f" (node {node_name!r})" if node_name else ""
        versions = ", ".join(f">={e.since}" for e in entries)
        known = f"; supported versions: {versions}" if entries else ""
        raise UnsupportedOperatorError(
            f"operator {domain or 'ai.onnx'}::{op_type} version {opset} is not supported "
            f"by the CPU device{where}{known}"
        )
    return chosen[-1]


OutKernel = Callable[..., Sequence[Any]]
"""The planned-memory form of a kernel: ``out_kernel(out, *inputs) -> outputs`` writes
output 0 into ``out``, a buffer with the shape and dtype that output had when the
request's memory plan was made, and returns it as output 0. When the inputs give output
0 another shape (data-dependent shapes), it returns a freshly allocated array instead."""

OutKernelFactory = Callable[["NodeSpec"], "OutKernel | None"]
"""Makes the out form of a node's kernel at compile time, or None when this node (its
attributes, dtypes) has none."""

_OUT_FACTORIES: dict[KernelFactory, OutKernelFactory] = {}


def out_kernel(of: KernelFactory) -> Callable[[OutKernelFactory], OutKernelFactory]:
    """Register ``factory`` as the out form of the kernel factory ``of``.

    A second, optional protocol next to :func:`kernel`: the memory planner binds the out
    form of a step to a buffer of the request's arena (see
    :mod:`aioinfer.devices.cpu.memory`); kernels without one allocate their outputs.
    """

    def register(factory: OutKernelFactory) -> OutKernelFactory:
        _OUT_FACTORIES[of] = factory
        return factory

    return register


def find_out_kernel(entry: KernelEntry) -> OutKernelFactory | None:
    """The out-form factory registered for ``entry``'s kernel factory, if any."""
    return _OUT_FACTORIES.get(entry.factory)


def registered_operators() -> dict[tuple[str, str], list[KernelEntry]]:
    """All registered operators and their versioned entries (for docs and query_model)."""
    return {key: list(entries) for key, entries in sorted(_REGISTRY.items())}


def attribute_value(attr: ir.Attr) -> Any:
    """Convert an IR attribute to the Python value kernels see."""
    kind = attr.type
    if kind == ir.AttributeType.TENSOR:
        return attr.as_tensor().numpy()
    if kind == ir.AttributeType.TENSORS:
        return [t.numpy() for t in attr.as_tensors()]
    if kind == ir.AttributeType.INTS:
        return list(attr.as_ints())
    if kind == ir.AttributeType.FLOATS:
        return list(attr.as_floats())
    if kind == ir.AttributeType.STRINGS:
        return list(attr.as_strings())
    return attr.value


def _dtype_of(value: ir.Value | None) -> np.dtype | None:
    if value is None or value.dtype is None:
        return None
    try:
        return np.dtype(value.dtype.numpy())
    except (TypeError, ValueError, NotImplementedError):
        return None


def _shape_of(value: ir.Value | None) -> tuple[int | str | None, ...] | None:
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def make_spec(
    node: ir.Node,
    opset: int,
    const_inputs: Sequence[np.ndarray | None] = (),
    subplans: dict[str, Any] | None = None,
) -> NodeSpec:
    """Describe ``node`` for a kernel factory (``subplans``: see :attr:`NodeSpec.subplans`)."""
    consts = tuple(const_inputs) + (None,) * (len(node.inputs) - len(const_inputs))
    return NodeSpec(
        op_type=node.op_type,
        domain="" if node.domain == "ai.onnx" else node.domain,
        opset=opset,
        name=node.name or "",
        attrs={name: attribute_value(attr) for name, attr in node.attributes.items()},
        num_inputs=len(node.inputs),
        num_outputs=len(node.outputs),
        const_inputs=consts,
        input_dtypes=tuple(_dtype_of(v) for v in node.inputs),
        output_dtypes=tuple(_dtype_of(v) for v in node.outputs),
        input_shapes=tuple(_shape_of(v) for v in node.inputs),
        subplans=dict(subplans or {}),
    )
