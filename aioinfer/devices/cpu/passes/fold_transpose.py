"""Fold a Transpose that swaps the last two axes into the matmul that reads it.

``MatMul(Transpose(A), B)`` becomes ``ai.aioinfer::FusedMatMul(A, B, transA=1)`` (and the
same for B), ``Gemm(Transpose(A), B)`` flips Gemm's own ``transA``: BLAS reads the
transposed operand in place, so the Transpose's copy disappears.
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    is_op,
    producer,
    replace,
    single_use,
)


def _swaps_last_two(node: ir.Node) -> bool:
    perm_attr = node.attributes.get("perm")
    if perm_attr is None:
        return False
    perm = list(perm_attr.as_ints())
    rank = len(perm)
    return rank >= 2 and perm == [*range(rank - 2), rank - 1, rank - 2]


def _flag(node: ir.Node, name: str) -> int:
    attr = node.attributes.get(name)
    return 0 if attr is None else attr.as_int()


class FoldTransposePass(RewritePass):
    """Transposes of the last two axes feeding MatMul/FusedMatMul/Gemm become flags."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        fused = ops.FUSED_MATMUL.matches(node)
        if not (is_op(node, "MatMul", "Gemm") or fused):
            return False
        for index, flag in ((0, ops.TRANS_A), (1, ops.TRANS_B)):
            operand = node.inputs[index]
            transpose = producer(operand, "Transpose")
            if transpose is None or not single_use(operand) or not _swaps_last_two(transpose):
                continue
            inputs = list(node.inputs)
            inputs[index] = transpose.inputs[0]
            # Gemm's transA/transB are FusedMatMul's: the same names, the same meaning.
            attrs = {name: attr for name, attr in node.attributes.items() if name != flag.name}
            attrs[flag.name] = flag(1 - _flag(node, flag.name))
            folded = (
                ir.Node("", "Gemm", inputs, list(attrs.values()), num_outputs=1, name=node.name)
                if node.op_type == "Gemm"
                else ops.FUSED_MATMUL.node(inputs, attrs.values(), name=node.name)
            )
            replace(graph, [transpose, node], folded, node.outputs[0])
            return True
        return False
