"""Fuse the decomposed LayerNorm that exporters emit before opset 17.

    mean = ReduceMean(x, axes=[-1]);  d = Sub(x, mean)
    var = ReduceMean(Pow(d, 2) | Mul(d, d), axes=[-1])
    y = Div(d, Sqrt(Add(var, epsilon)))  [-> Mul(y, gamma)] [-> Add(., beta)]

becomes ``ai.aioinfer::LayerNormalization(x, gamma, beta, axis=-1, epsilon)``: three
passes over the data instead of nine, and no temporaries per step.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    initializer,
    ints,
    is_op,
    only_use,
    other_input,
    producer,
    rank,
    replace,
    scalar,
    single_use,
)


def _last_axis_mean(node: ir.Node | None, x: ir.Value | None) -> bool:
    """``node`` is ReduceMean(x) over the last axis only, keeping it."""
    if node is None or node.inputs[0] is not x:
        return False
    keepdims = node.attributes.get("keepdims")
    if keepdims is not None and keepdims.as_int() == 0:
        return False
    if "axes" in node.attributes:
        axes = list(node.attributes["axes"].as_ints())
    else:
        given = ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if given is None:
            return False
        axes = given
    axes_of_x = rank(x)
    return axes == [-1] or (axes_of_x is not None and axes == [axes_of_x - 1])


class FuseLayerNormPass(RewritePass):
    """The decomposed LayerNorm pattern, rooted at its Div, becomes one node."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "Div"):
            return False
        d, std = node.inputs
        sub, sqrt = producer(d, "Sub"), producer(std, "Sqrt")
        if d is None or sub is None or sqrt is None or not single_use(std):
            return False
        x, mean = sub.inputs
        reduce_mean = producer(mean, "ReduceMean")
        if not _last_axis_mean(reduce_mean, x) or not single_use(mean):
            return False
        add_eps = producer(sqrt.inputs[0], "Add")
        if add_eps is None or not single_use(sqrt.inputs[0]):
            return False
        var, eps_value = add_eps.inputs
        epsilon = scalar(eps_value)
        reduce_var = producer(var, "ReduceMean")
        if epsilon is None or reduce_var is None or not single_use(var):
            return False
        square = reduce_var.inputs[0]
        squarer = producer(square, "Pow", "Mul")
        if squarer is None or not single_use(square) or not _last_axis_mean(reduce_var, square):
            return False
        if squarer.op_type == "Pow":
            if squarer.inputs[0] is not d or scalar(squarer.inputs[1]) != 2.0:
                return False
        elif list(squarer.inputs) != [d, d]:
            return False
        if len(list(d.uses())) != 2 + (squarer.op_type == "Mul") or d.is_graph_output():
            return False
        matched = [reduce_mean, sub, squarer, reduce_var, add_eps, sqrt, node]
        gamma, beta, out = self._affine(node)
        matched += [n for n in (gamma[1], beta[1]) if n is not None]
        width = x.shape[-1] if x is not None and x.shape is not None else None
        scale = gamma[0]
        if scale is None:
            if not isinstance(width, int):
                return False
            dtype = x.dtype.numpy() if x is not None and x.dtype is not None else np.float32
            scale = initializer(graph, f"{node.name or 'layernorm'}.scale", np.ones(width, dtype))
        fused = ops.LAYER_NORMALIZATION.node(
            [x, scale, beta[0]] if beta[0] is not None else [x, scale],
            [ops.AXIS(-1), ops.EPSILON(float(epsilon))],
            name=node.name,
        )
        replace(graph, [n for n in matched if n is not None], fused, out)
        return True

    @staticmethod
    def _affine(div: ir.Node) -> tuple[_Operand, _Operand, ir.Value]:
        """The constant gamma (a Mul) and beta (an Add) that follow ``div``, if any, and
        the value the pattern ends with."""
        out = div.outputs[0]
        found: dict[str, _Operand] = {"Mul": (None, None), "Add": (None, None)}
        for op_type in ("Mul", "Add"):
            user = only_use(out)
            if user is None or not is_op(user, op_type):
                continue
            other = other_input(user, out)
            values = constant(other)
            if values is None or values.ndim > 1:
                break
            found[op_type] = (other, user)
            out = user.outputs[0]
        return found["Mul"], found["Add"], out


_Operand = tuple["ir.Value | None", "ir.Node | None"]
"""A constant operand of the pattern and the node that applies it (both None if absent)."""
