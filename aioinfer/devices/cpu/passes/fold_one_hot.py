"""A one-hot encoding multiplied by a constant matrix becomes a row lookup.

jax2tf exports ``jax.nn.one_hot(x, K) @ W`` as

    MatMul(Cast(Equal(x, [[[0, 1, ..., K-1]]])), W)         (x of shape [..., 1])

and Magika embeds its 2048 input bytes so: a (2048, 257) float one-hot array, compared,
cast and multiplied by a 257 x 64 matrix, 0.45 of its 5 ms. Each row of that product is
the row of ``W`` the index names (a sum of exact zeros and one ``W[k]``, for a ``W``
without infinities or NaNs), or zeros for an index outside ``[0, K)``. It becomes
``ai.aioinfer::OneHotMatMul(x, table)``: ``table`` is ``W`` with one more row (zeros)
for such indices, and a constant bias added to the product after it (``Add``, broadcast
over the rows) joins every row of the table, as the same float additions. A lookup of
2048 rows then takes about 10 us.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    fed_by,
    initializer,
    is_op,
    only_use,
    other_input,
    rank,
    replace,
)


def _classes(value: ir.Value | None, count: int) -> bool:
    """Whether ``value`` is the constant ``[0, 1, ..., count - 1]`` along its last axis
    (every other axis of length 1)."""
    array = constant(value)
    return (
        array is not None
        and array.dtype.kind in "iu"
        and array.ndim >= 1
        and array.shape[-1] == count
        and array.size == count
        and np.array_equal(array.reshape(-1), np.arange(count))
    )


def _indices_fit(value: ir.Value | None, classes: ir.Value | None) -> bool:
    """Whether ``value`` is integer, of known rank at least that of ``classes``, with a
    last axis of length 1 (so that the comparison's shape is its own but the last)."""
    if value is None or classes is None or value.shape is None or classes.shape is None:
        return False
    dtype = value.dtype
    if dtype is None or not dtype.is_integer():
        return False
    shape = value.shape
    return len(shape) >= len(classes.shape) and len(shape) >= 1 and shape[-1] == 1


def _row_bias(value: ir.Value | None, columns: int, dtype: np.dtype) -> np.ndarray | None:
    """``value`` as a row of ``columns`` when it is a constant of ``dtype`` that
    broadcasts along the last axis only (every other axis of length 1)."""
    array = constant(value)
    if array is None or array.dtype != dtype or array.ndim == 0:
        return None
    if array.shape[-1] not in (1, columns) or array.size != array.shape[-1]:
        return None
    return np.broadcast_to(array.reshape(-1), (columns,))


class FoldOneHotMatMulPass(RewritePass):
    """``MatMul(Cast(Equal(x, arange(K))), W)`` (plus a constant row bias) becomes a
    ``OneHotMatMul`` lookup of ``x`` in a table made of ``W``."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "MatMul"):
            return False
        weight = constant(node.inputs[1])
        cast = fed_by(node.inputs[0], node, "Cast")
        if (
            weight is None
            or weight.ndim != 2
            or weight.dtype.kind != "f"
            or not np.isfinite(weight).all()
            or cast is None
        ):
            return False
        to = cast.attributes.get("to")
        if to is None or ir.DataType(to.as_int()).numpy() != weight.dtype:
            return False
        equal = fed_by(cast.inputs[0], cast, "Equal")
        if equal is None:
            return False
        count = weight.shape[0]
        for indices, classes in (equal.inputs, equal.inputs[::-1]):
            if _classes(classes, count) and _indices_fit(indices, classes):
                break
        else:
            return False
        table = np.concatenate([weight, np.zeros((1, weight.shape[1]), weight.dtype)])
        nodes, out = [equal, cast, node], node.outputs[0]
        add = only_use(out)
        if is_op(add, "Add"):
            other = other_input(add, out)
            bias = _row_bias(other, weight.shape[1], weight.dtype)
            bias_rank, out_rank = rank(other), rank(out)
            if bias is not None and (
                out_rank is None or (bias_rank is not None and bias_rank <= out_rank)
            ):
                table = table + bias  # the product's rows plus the bias, as at run time
                nodes, out = [*nodes, add], add.outputs[0]
        name = node.name or "one_hot_matmul"
        lookup = ops.ONE_HOT_MATMUL.node(
            [indices, initializer(graph, f"{name}.table", table)], name=node.name
        )
        replace(graph, nodes, lookup, out)
        return True
