"""MatMul followed by an Add of a bias becomes one node.

``Add(MatMul(A, W), b)`` with a 2-D A and constant 2-D W becomes ``Gemm(A, W, b)``, any
other shape ``ai.aioinfer::FusedMatMul(A, W, b)``: the bias is added in place on the
product instead of in a second pass that allocates a new tensor.
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    is_op,
    producer,
    rank,
    replace,
    single_use,
)

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)


class FuseMatMulAddPass(RewritePass):
    """``Add(MatMul(A, W), b)`` -> ``Gemm`` (2-D) or ``FusedMatMul`` with a bias."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "Add") or len(node.inputs) != 2:
            return False
        for index in (0, 1):
            product = node.inputs[index]
            bias = node.inputs[1 - index]
            matmul = producer(product, "MatMul") or ops.FUSED_MATMUL.producer(product)
            if matmul is None or not single_use(product) or product is bias:
                continue
            if product is None or product.dtype not in (None, *_FLOATS) or len(matmul.inputs) > 2:
                continue
            if ops.ACTIVATION.of(matmul) is not None:
                continue
            fused = self._gemm(matmul, bias) or ops.FUSED_MATMUL.node(
                [*matmul.inputs, bias], matmul.attributes.values(), name=matmul.name
            )
            replace(graph, [matmul, node], fused, node.outputs[0])
            return True
        return False

    @staticmethod
    def _gemm(matmul: ir.Node, bias: ir.Value | None) -> ir.Node | None:
        a, w = matmul.inputs[0], matmul.inputs[1]
        weight, b = constant(w), constant(bias)
        if matmul.op_type != "MatMul" or rank(a) != 2 or weight is None or b is None:
            return None
        if weight.ndim != 2 or b.ndim > 2 or (b.ndim == 2 and b.shape[0] != 1):
            return None
        if b.size not in (1, weight.shape[1]):
            return None
        return ir.Node("", "Gemm", [a, w, bias], num_outputs=1, name=matmul.name)
