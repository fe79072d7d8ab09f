"""Fuse scaled dot-product attention into one node.

    MatMul(Softmax(Add(Div|Mul(MatMul(Q, Kt), c), mask), axis=-1), V)

(the scale and the mask are optional) becomes ``ai.aioinfer::Attention(Q, Kt, V, mask,
scale)``: the scores are scaled, masked and normalised in place in one buffer.
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    is_op,
    only_use,
    producer,
    replace,
    scalar,
    single_use,
)


def _softmax_over_last_axis(node: ir.Node, opset: int) -> bool:
    axis_attr = node.attributes.get("axis")
    value = node.inputs[0]
    rank = None if value is None or value.shape is None else len(value.shape)
    if axis_attr is None:
        return opset >= 13 or rank == 2  # default -1 from 13 on, 1 before
    axis = axis_attr.as_int()
    return axis == -1 or (rank is not None and axis == rank - 1)


class FuseAttentionPass(RewritePass):
    """The attention pattern, rooted at its Softmax, becomes one ``Attention`` node."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._opset = model.opset_imports.get("", 1)
        return super().call(model)

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "Softmax") or not _softmax_over_last_axis(node, self._opset):
            return False
        out = only_use(node.outputs[0])
        if out is None or not is_op(out, "MatMul") or out.inputs[0] is not node.outputs[0]:
            return False
        matched: list[ir.Node] = []
        value = node.inputs[0]
        mask = None
        adder = producer(value, "Add")
        if adder is not None and single_use(value):
            left, right = adder.inputs
            scores_side = left if producer(left, "MatMul", "Div", "Mul") else right
            mask = right if scores_side is left else left
            matched.append(adder)
            value = scores_side
        scale = 1.0
        scaler = producer(value, "Div", "Mul")
        if scaler is not None and single_use(value):
            factor = scalar(scaler.inputs[1])
            if factor is not None and factor != 0.0:
                scale = 1.0 / factor if scaler.op_type == "Div" else factor
                matched.append(scaler)
                value = scaler.inputs[0]
        product = producer(value, "MatMul")
        if product is None or not single_use(value):
            return False
        q, kt = product.inputs
        inputs = [q, kt, out.inputs[1]] + ([mask] if mask is not None else [])
        fused = ops.ATTENTION.node(inputs, [ops.SCALE(scale)], name=node.name)
        replace(graph, [product, *reversed(matched), node, out], fused, out.outputs[0])
        return True
