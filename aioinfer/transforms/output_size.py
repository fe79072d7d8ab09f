"""How many elements a node would produce, known before running it.

Constant folding computes a node only when its result is small enough to keep as a
weight. Checking the result's size after computing it is too late for the operators
whose output grows from a small input: a ``ConstantOfShape`` of a 5e8-element shape
allocated 2 GB during compile before the folding cap threw it away. Here the size comes
from the shapes (and the few small constant values) that define it, without computing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

Inputs = Sequence[np.ndarray | None]

BROADCASTING = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Mod",
        "And",
        "Or",
        "Xor",
        "Equal",
        "Greater",
        "GreaterOrEqual",
        "Less",
        "LessOrEqual",
        "Max",
        "Min",
        "Mean",
        "Sum",
        "BitShift",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "PRelu",
        "Where",
    }
)
"""Operators whose output has the broadcast shape of their inputs."""

SAME_SIZE = frozenset(
    {
        "Identity",
        "Cast",
        "CastLike",
        "Transpose",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "DequantizeLinear",
        "QuantizeLinear",
    }
)
"""Operators whose output has as many elements as their first input."""


def _shape_values(array: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _product(dims: Sequence[int]) -> int:
    return math.prod(max(int(d), 0) for d in dims)


def _broadcast(node: ir.Node, inputs: Inputs) -> int | None:
    shapes = [a.shape for a in inputs if a is not None]
    return _product(np.broadcast_shapes(*shapes)) if shapes else None


def _constant_of_shape(node: ir.Node, inputs: Inputs) -> int | None:
    return None if inputs[0] is None else _product(_shape_values(inputs[0]))


def _expand(node: ir.Node, inputs: Inputs) -> int | None:
    data, shape = inputs[0], inputs[1]
    if data is None or shape is None:
        return None
    return _product(np.broadcast_shapes(data.shape, tuple(_shape_values(shape))))


def _tile(node: ir.Node, inputs: Inputs) -> int | None:
    data, repeats = inputs[0], inputs[1]
    if data is None or repeats is None:
        return None
    return data.size * _product(_shape_values(repeats))


def _range(node: ir.Node, inputs: Inputs) -> int | None:
    if any(a is None for a in inputs[:3]):
        return None
    start, limit, delta = (np.asarray(a).item() for a in inputs[:3])
    steps = (limit - start) / delta if delta else math.nan
    if not math.isfinite(steps):
        return None  # the kernel refuses it without allocating
    return max(math.ceil(steps), 0)


def _one_hot(node: ir.Node, inputs: Inputs) -> int | None:
    indices, depth = inputs[0], inputs[1]
    if indices is None or depth is None:
        return None
    return indices.size * max(int(np.asarray(depth).reshape(-1)[0]), 0)


def _gather(node: ir.Node, inputs: Inputs) -> int | None:
    data, indices = inputs[0], inputs[1]
    if data is None or indices is None or data.ndim == 0:
        return None
    axis = _int_attr(node, "axis", 0) % data.ndim
    return _product(data.shape[:axis]) * indices.size * _product(data.shape[axis + 1 :])


def _matmul(node: ir.Node, inputs: Inputs) -> int | None:
    a, b = inputs[0], inputs[1]
    if a is None or b is None or a.ndim == 0 or b.ndim == 0:
        return None
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    rows = a.shape[-2] if a.ndim >= 2 else 1
    columns = b.shape[-1] if b.ndim >= 2 else 1
    return _product(batch) * rows * columns


def _gemm(node: ir.Node, inputs: Inputs) -> int | None:
    a, b = inputs[0], inputs[1]
    if a is None or b is None or a.ndim != 2 or b.ndim != 2:
        return None
    rows = a.shape[1] if _int_attr(node, "transA", 0) else a.shape[0]
    columns = b.shape[0] if _int_attr(node, "transB", 0) else b.shape[1]
    return int(rows) * int(columns)


def _pad(node: ir.Node, inputs: Inputs) -> int | None:
    data = inputs[0]
    if data is None:
        return None
    if "pads" in node.attributes:  # before opset 11
        pads = list(node.attributes["pads"].as_ints())
    elif len(inputs) > 1 and inputs[1] is not None:
        pads = _shape_values(inputs[1])
    else:
        return None
    axes = list(range(data.ndim))
    if len(inputs) > 3 and inputs[3] is not None:
        axes = [a % data.ndim for a in _shape_values(inputs[3])]
    if len(pads) != 2 * len(axes):
        return None
    dims = list(data.shape)
    for i, axis in enumerate(axes):
        dims[axis] += pads[i] + pads[i + len(axes)]
    return _product(dims)


def _resize(node: ir.Node, inputs: Inputs) -> int | None:
    """Resize (and Upsample): from ``sizes`` when given, else ``scales``."""
    data = inputs[0]
    if data is None:
        return None
    if node.op_type == "Upsample":
        scales = inputs[1] if len(inputs) > 1 else None
        if scales is None and "scales" in node.attributes:
            scales = np.asarray(node.attributes["scales"].as_floats())
        sizes = None
    else:
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
    axes = list(range(data.ndim))
    if "axes" in node.attributes:
        axes = [a % data.ndim for a in node.attributes["axes"].as_ints()]
    dims = list(data.shape)
    if sizes is not None and sizes.size:
        values = _shape_values(sizes)
    elif scales is not None and scales.size:
        values = [
            math.floor(dims[axis] * float(s))
            for axis, s in zip(axes, np.asarray(scales).reshape(-1), strict=False)
        ]
    else:
        return None
    if len(values) != len(axes):
        return None
    for axis, value in zip(axes, values, strict=True):
        dims[axis] = value
    return _product(dims)


def _same_size(node: ir.Node, inputs: Inputs) -> int | None:
    return None if not inputs or inputs[0] is None else int(inputs[0].size)


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.as_int())


_RULES: dict[str, Callable[[ir.Node, Inputs], int | None]] = {
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "OneHot": _one_hot,
    "Gather": _gather,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "Gemm": _gemm,
    "Pad": _pad,
    "Resize": _resize,
    "Upsample": _resize,
    **dict.fromkeys(BROADCASTING, _broadcast),
    **dict.fromkeys(SAME_SIZE, _same_size),
}


def declared_elements(node: ir.Node) -> int | None:
    """The element count of ``node``'s largest output whose shape the graph states as
    static (from the model or shape inference), or None when none is known."""
    sizes = [
        _product(value.shape)  # type: ignore[arg-type]
        for value in node.outputs
        if value.shape is not None and all(isinstance(d, int) for d in value.shape)
    ]
    return max(sizes, default=None)


def output_elements(node: ir.Node, inputs: Inputs) -> int | None:
    """The element count of ``node``'s largest output, derived from its constant
    ``inputs`` and attributes without computing it, or None when there is no rule for
    the operator (or the inputs are invalid for it: the kernel then says why)."""
    rule = _RULES.get(node.op_type)
    if rule is None:
        return None
    try:
        return rule(node, inputs)
    except (ValueError, TypeError, IndexError, OverflowError, ZeroDivisionError):
        return None
