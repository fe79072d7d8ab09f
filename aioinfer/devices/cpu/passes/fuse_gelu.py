"""Fuse the erf and tanh forms of GELU that exporters emit before opset 20.

    Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)      (or Mul(x, 1/sqrt 2) inside Erf,
    Mul(Mul(x, 0.5), Add(Erf(...), 1)), operands in either order)

becomes ``ai.aioinfer::Gelu(x)``: one pass with a float32 erf instead of five passes and
the float64 exact erf. The tanh approximation

    x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

(the cube as ``Pow(x, 3)`` or as products of ``x``, the factors in any order and
grouping; jax2tf's form in Magika: ten nodes) becomes ``ai.aioinfer::Gelu(x)`` with
``approximate="tanh"``: nine in-place passes into one buffer instead of ten passes into
ten (Magika's two: 0.40 -> 0.2 ms of its 5 ms).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    fed_by,
    grows_rank,
    is_op,
    only_use,
    other_input,
    producer,
    replace,
    scalar,
)


def _close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=1e-4)


def _monomial(
    value: ir.Value | None, x: ir.Value, nodes: list[ir.Node]
) -> tuple[int, float] | None:
    """``value`` as ``coefficient * x**degree`` (products of ``x``, scalar constants and
    ``Pow(x, n)``), appending the nodes that compute it to ``nodes``; None when it is not
    one, or one of those nodes' outputs is read elsewhere."""
    if value is x:
        return 1, 1.0
    factor = scalar(value)
    if factor is not None:
        return 0, factor
    node = producer(value, "Mul", "Pow")
    if node is None or only_use(value) is None:
        return None
    if node.op_type == "Pow":
        exponent = scalar(node.inputs[1])
        if node.inputs[0] is not x or exponent is None or exponent != int(exponent):
            return None
        nodes.append(node)
        return int(exponent), 1.0
    left = _monomial(node.inputs[0], x, nodes)
    right = _monomial(node.inputs[1], x, nodes) if left is not None else None
    if left is None or right is None:
        return None
    nodes.append(node)
    return left[0] + right[0], left[1] * right[1]


def _fits(x: ir.Value, constants: list[ir.Value | None]) -> bool:
    """Whether adding or multiplying ``constants`` leaves ``x``'s shape as it is."""
    for value in constants:
        array = constant(value)
        if array is None or grows_rank(array, x):
            return False
    return True


class FuseGeluPass(RewritePass):
    """The erf GELU pattern, rooted at its Erf, and the tanh one, rooted at its Tanh,
    become one ``Gelu`` node each."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if is_op(node, "Tanh"):
            return self._tanh(graph, node)
        if not is_op(node, "Erf"):
            return False
        scaled = node.inputs[0]
        scaler = fed_by(scaled, node, "Div", "Mul")
        if scaler is None:
            return False
        x = scaler.inputs[0]
        factor = scalar(scaler.inputs[1])
        expected = math.sqrt(2) if scaler.op_type == "Div" else math.sqrt(0.5)
        if not _close(factor, expected):
            return False
        add = only_use(node.outputs[0])
        if (
            add is None
            or not is_op(add, "Add")
            or not _close(scalar(other_input(add, node.outputs[0])), 1.0)
        ):
            return False
        matched = self._product(x, add)
        if matched is None:
            return False
        nodes, out = matched
        fused = ops.GELU.node([x], name=node.name)
        replace(graph, [scaler, node, add, *nodes], fused, out)
        return True

    @staticmethod
    def _product(x: ir.Value | None, add: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
        """The Muls by ``x`` and by 0.5 that follow ``add``, in either arrangement."""
        one_plus = add.outputs[0]
        mul = only_use(one_plus)
        if mul is None or not is_op(mul, "Mul"):
            return None
        other = other_input(mul, one_plus)
        if other is x:  # x * (1 + erf), then * 0.5
            half = only_use(mul.outputs[0])
            if half is None or not is_op(half, "Mul"):
                return None
            if not _close(scalar(other_input(half, mul.outputs[0])), 0.5):
                return None
            return [mul, half], half.outputs[0]
        halver = fed_by(other, mul, "Mul")  # (x * 0.5) * (1 + erf)
        if halver is None or x not in halver.inputs:
            return None
        if not _close(scalar(other_input(halver, x)), 0.5):
            return None
        return [halver, mul], mul.outputs[0]

    @staticmethod
    def _tanh(graph: ir.Graph, tanh: ir.Node) -> bool:
        """``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``, rooted at its Tanh."""
        scaled = tanh.inputs[0]
        scaler = fed_by(scaled, tanh, "Mul")
        if scaler is None:
            return False
        inner, factor = scaler.inputs
        if not _close(scalar(factor), math.sqrt(2 / math.pi)):
            inner, factor = factor, inner
            if not _close(scalar(factor), math.sqrt(2 / math.pi)):
                return False
        add = fed_by(inner, scaler, "Add")
        if add is None:
            return False
        for x, cube in (add.inputs, add.inputs[::-1]):
            nodes: list[ir.Node] = []
            term = None if x is None else _monomial(cube, x, nodes)
            if term is not None and term[0] == 3 and _close(term[1], 0.044715):
                break
        else:
            return False
        assert x is not None
        constants = [
            n for node in nodes for n in node.inputs if n is not x and constant(n) is not None
        ]
        one_plus = only_use(tanh.outputs[0])
        if one_plus is None or not is_op(one_plus, "Add"):
            return False
        if not _close(scalar(other_input(one_plus, tanh.outputs[0])), 1.0):
            return False
        tail = FuseGeluPass._half_product(x, one_plus)
        if tail is None:
            return False
        tail_nodes, out, tail_constants = tail
        constants += [factor, other_input(one_plus, tanh.outputs[0]), *tail_constants]
        if not _fits(x, constants):
            return False
        fused = ops.GELU.node([x], [ops.APPROXIMATE("tanh")], name=tanh.name)
        replace(graph, [*nodes, add, scaler, tanh, one_plus, *tail_nodes], fused, out)
        return True

    @staticmethod
    def _half_product(
        x: ir.Value, one_plus: ir.Node
    ) -> tuple[list[ir.Node], ir.Value, list[ir.Value | None]] | None:
        """The nodes that multiply ``one_plus``'s output by ``x`` and 0.5 (in any order),
        the value they make, and the 0.5 constant."""
        value = one_plus.outputs[0]
        first = only_use(value)
        if not is_op(first, "Mul"):
            return None
        other = other_input(first, value)
        second = only_use(first.outputs[0])
        if other is x or _close(scalar(other), 0.5):  # (1 + t) * x * 0.5, (1 + t) * 0.5 * x
            wanted_half = other is x
            if not is_op(second, "Mul"):
                return None
            last = other_input(second, first.outputs[0])
            if wanted_half and _close(scalar(last), 0.5):
                return [first, second], second.outputs[0], [last]
            if not wanted_half and last is x:
                return [first, second], second.outputs[0], [other]
            return None
        halver = fed_by(other, first, "Mul")  # (x * 0.5) * (1 + t)
        if halver is None or x not in halver.inputs:
            return None
        half = other_input(halver, x)
        if not _close(scalar(half), 0.5):
            return None
        return [halver, first], first.outputs[0], [half]
