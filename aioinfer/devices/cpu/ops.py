"""The CPU device's own operators (domain ``ai.aioinfer``, version 1), declared once.

The fusion passes (:mod:`aioinfer.devices.cpu.passes`) build and match these nodes, the
kernels (:mod:`aioinfer.devices.cpu.kernels`) register under these names and read these
attributes: both import the declarations below rather than writing an operator's or an
attribute's name, so a rename is one edit and a misspelt name is an error where it is
written, not a node that no kernel runs.

An :class:`Op` that ``extends`` an ONNX operator (``FusedConv`` of ``Conv``) also takes
that operator's attributes, copied from the node it replaces.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

import onnx_ir as ir

from aioinfer.transforms.rewrite import AIOINFER_DOMAIN, is_op, producer

DOMAIN = AIOINFER_DOMAIN
"""The domain of the operators below."""

T = TypeVar("T")


class _HasAttributes(Protocol):
    def attr(self, name: str, default: Any = None) -> Any: ...


@dataclass(frozen=True)
class Attribute(Generic[T]):
    """An attribute of an :class:`Op`: its name, its type and its value when unset
    (None when the op requires it)."""

    name: str
    type: ir.AttributeType
    default: T | None = None

    def __call__(self, value: T) -> ir.Attr:
        """The IR attribute of this name and type holding ``value`` (an enum member's
        value, a plain string, for :class:`Activation`)."""
        return ir.Attr(self.name, self.type, value.value if isinstance(value, enum.Enum) else value)

    def of(self, node: ir.Node) -> ir.Attr | None:
        """The attribute as ``node`` sets it, None when it does not."""
        return node.attributes.get(self.name)

    def read(self, spec: _HasAttributes) -> Any:
        """The value a kernel's node spec gives the attribute, else the default."""
        return spec.attr(self.name, self.default)


@dataclass(frozen=True)
class Op:
    """One operator of the ``ai.aioinfer`` domain: its name and attributes."""

    name: str
    attributes: tuple[Attribute[Any], ...] = ()
    extends: str = ""
    """The ONNX operator whose attributes this one also takes ("" for none)."""

    def node(
        self,
        inputs: Sequence[ir.Value | None],
        attributes: Iterable[ir.Attr] = (),
        *,
        num_outputs: int = 1,
        name: str | None = None,
    ) -> ir.Node:
        """A node of this operator.

        Raises:
            ValueError: an attribute this operator does not declare (one that extends
                an ONNX operator takes any of that operator's too, unchecked).
        """
        attrs = list(attributes)
        if not self.extends:
            declared = {a.name for a in self.attributes}
            unknown = [a.name for a in attrs if a.name not in declared]
            if unknown:
                raise ValueError(
                    f"{DOMAIN}::{self.name} declares the attributes {sorted(declared)}, "
                    f"got {unknown}"
                )
        return ir.Node(DOMAIN, self.name, inputs, attrs, num_outputs=num_outputs, name=name)

    def matches(self, node: ir.Node | None) -> TypeGuard[ir.Node]:
        """Whether ``node`` is of this operator."""
        return is_op(node, self.name, domain=DOMAIN)

    def producer(self, value: ir.Value | None) -> ir.Node | None:
        """The node of this operator that produced ``value`` in the graph being
        rewritten, else None (see :func:`aioinfer.transforms.rewrite.producer`)."""
        return producer(value, self.name, domain=DOMAIN)


class Activation(enum.StrEnum):
    """The activations a fused product applies (its ``activation`` attribute)."""

    RELU = "Relu"
    LEAKY_RELU = "LeakyRelu"
    """Parameters: alpha, and optionally a floor (the constant of a ``Max`` after it)."""
    CLIP = "Clip"
    """Parameters: min, max."""
    SIGMOID = "Sigmoid"
    TANH = "Tanh"
    GELU = "Gelu"
    GELU_TANH = "GeluTanh"
    """Gelu's tanh approximation."""
    HARD_SIGMOID = "HardSigmoid"
    """Parameters: alpha, beta."""
    HARD_SWISH = "HardSwish"
    """Parameters: none, or ``[HARD_SWISH_SCALE]`` for that many times it."""
    SWISH = "Swish"
    """``x * sigmoid(x)`` (SiLU)."""


HARD_SWISH_SCALE = 6.0
"""The parameter of a HardSwish activation computed six times over (its readers took the
1/6 into their weights)."""

ACTIVATION = Attribute[str]("activation", ir.AttributeType.STRING, "")
"""An :class:`Activation` applied to the product in place; empty for none."""
ACTIVATION_PARAMS = Attribute[list[float]]("activation_params", ir.AttributeType.FLOATS, [])
"""The activation's parameters (see :class:`Activation`)."""
ALPHA = Attribute[float]("alpha", ir.AttributeType.FLOAT, 1.0)
TRANS_A = Attribute[int]("transA", ir.AttributeType.INT, 0)
TRANS_B = Attribute[int]("transB", ir.AttributeType.INT, 0)
SCALE = Attribute[float]("scale", ir.AttributeType.FLOAT, 1.0)
AXIS = Attribute[int]("axis", ir.AttributeType.INT, -1)
EPSILON = Attribute[float]("epsilon", ir.AttributeType.FLOAT, 1e-5)
APPROXIMATE = Attribute[str]("approximate", ir.AttributeType.STRING, "none")
"""``"tanh"`` for Gelu's tanh approximation."""
HIDDEN_SIZES = Attribute[list[int]]("hidden_sizes", ir.AttributeType.INTS)
LAYER_NAMES = Attribute[list[str]]("layer_names", ir.AttributeType.STRINGS, [])
SLICE_AXIS = Attribute[int]("axis", ir.AttributeType.INT)
HIDDEN_SIZE = Attribute[int]("hidden_size", ir.AttributeType.INT)
OFFSET = Attribute[float]("offset", ir.AttributeType.FLOAT)
TO = Attribute[int]("to", ir.AttributeType.INT)
"""The integer data type (``onnx.TensorProto`` number) of the result."""

_EPILOGUE = (ACTIVATION, ACTIVATION_PARAMS)

FUSED_CONV = Op("FusedConv", _EPILOGUE, extends="Conv")
"""``FusedConv(X, W, B?, Z?)``: Conv, then ``+ Z`` (a residual) and an activation."""
FUSED_GEMM = Op("FusedGemm", _EPILOGUE, extends="Gemm")
"""``FusedGemm(A, B, C?)``: Gemm plus an activation."""
FUSED_MATMUL = Op("FusedMatMul", (ALPHA, TRANS_A, TRANS_B, *_EPILOGUE), extends="MatMul")
"""``FusedMatMul(A, B, bias?)``: ``alpha * A' @ B' + bias`` with ``transA``/``transB``
(the last two axes swapped) on N-D operands, plus an activation."""
ATTENTION = Op("Attention", (SCALE,))
"""``Attention(Q, Kt, V, mask?)``: ``softmax(scale * Q @ Kt + mask) @ V``."""
LAYER_NORMALIZATION = Op("LayerNormalization", (AXIS, EPSILON))
"""``LayerNormalization(X, scale, bias?)`` over the axes from ``axis`` on, one output."""
GELU = Op("Gelu", (APPROXIMATE,))
"""``Gelu(X)``, in float32 with a fast erf."""
ONE_HOT_MATMUL = Op("OneHotMatMul")
"""``OneHotMatMul(indices, table)``: ``MatMul(one_hot(indices), W) (+ bias)`` as a lookup
of rows of ``table``."""
LSTM_STACK = Op("LSTMStack", (HIDDEN_SIZES, LAYER_NAMES))
"""``LSTMStack(X, then W, R, B?, initial_h?, initial_c? of each layer)``: stacked LSTM
layers; outputs the last layer's Y, then Y_h and Y_c of each layer."""
SLICE_ASSIGN = Op("SliceAssign", (SLICE_AXIS,))
"""``SliceAssign(data, value, start, end)``: a copy of ``data`` with a slice written."""
GRU_GATES = Op("GRUGates", (HIDDEN_SIZE,))
"""``GRUGates(gx, gh, h)``: a GRU cell's gates after its two projections."""
CAST_ADD = Op("CastAdd", (OFFSET, TO))
"""``CastAdd(x)``: ``Cast(Add(Cast(x, FLOAT), offset), to)``."""

OPS: dict[str, Op] = {
    op.name: op
    for op in (
        FUSED_CONV,
        FUSED_GEMM,
        FUSED_MATMUL,
        ATTENTION,
        LAYER_NORMALIZATION,
        GELU,
        ONE_HOT_MATMUL,
        LSTM_STACK,
        SLICE_ASSIGN,
        GRU_GATES,
        CAST_ADD,
    )
}
"""Every operator of the domain, by name."""
