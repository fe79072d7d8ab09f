"""Fuse the erf form of GELU that exporters emit before opset 20.

    Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)      (or Mul(x, 1/sqrt 2) inside Erf,
    Mul(Mul(x, 0.5), Add(Erf(...), 1)), operands in either order)

becomes ``ai.aioinfer::Gelu(x)``: one pass with a float32 erf instead of five passes and
the float64 exact erf.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from aioinfer.transforms.rewrite import (
    AIOINFER_DOMAIN,
    RewritePass,
    is_op,
    only_use,
    producer,
    replace,
    scalar,
)


def _close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=1e-4)


def _other(node: ir.Node, value: ir.Value | None) -> ir.Value | None:
    """The operand of the binary ``node`` that is not ``value``."""
    first, second = node.inputs
    return second if first is value else first


class FuseGeluPass(RewritePass):
    """The erf GELU pattern, rooted at its Erf, becomes one ``Gelu`` node."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "Erf"):
            return False
        scaled = node.inputs[0]
        scaler = producer(scaled, "Div", "Mul")
        if scaler is None or only_use(scaled) is not node:
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
            or not _close(scalar(_other(add, node.outputs[0])), 1.0)
        ):
            return False
        matched = self._product(x, add)
        if matched is None:
            return False
        nodes, out = matched
        fused = ir.Node(AIOINFER_DOMAIN, "Gelu", [x], num_outputs=1, name=node.name)
        replace(graph, [scaler, node, add, *nodes], fused, out)
        return True

    @staticmethod
    def _product(x: ir.Value | None, add: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
        """The Muls by ``x`` and by 0.5 that follow ``add``, in either arrangement."""
        one_plus = add.outputs[0]
        mul = only_use(one_plus)
        if mul is None or not is_op(mul, "Mul"):
            return None
        other = _other(mul, one_plus)
        if other is x:  # x * (1 + erf), then * 0.5
            half = only_use(mul.outputs[0])
            if half is None or not is_op(half, "Mul"):
                return None
            if not _close(scalar(_other(half, mul.outputs[0])), 0.5):
                return None
            return [mul, half], half.outputs[0]
        halver = producer(other, "Mul")  # (x * 0.5) * (1 + erf)
        if halver is None or only_use(other) is not mul or x not in halver.inputs:
            return None
        if not _close(scalar(_other(halver, x)), 0.5):
            return None
        return [halver, mul], mul.outputs[0]
