"""Store the constant right operand of matrix products in the layout BLAS reads fastest.

Exporters write a Linear layer as ``Gemm(x, W, b, transB=1)`` with ``W`` of shape
``[out, in]``: run as it is, every call multiplies by a transposed view of ``W``, which
OpenBLAS reads about 10% slower than a C-contiguous matrix (float32, one thread, 8 to 64
rows of 1024). This pass transposes such weights once, at compile time:

- An initializer read *only* as the ``B`` operand of ``Gemm``/``FusedGemm``/
  ``FusedMatMul`` nodes with ``transB=1`` (one node, or several sharing the weight) is
  stored with its last two axes swapped, C-contiguous, and those nodes get ``transB=0``.
- Any other initializer read as ``B`` by ``MatMul``/``Gemm``/``FusedGemm``/``FusedMatMul``
  that is not C-contiguous (a ``Transpose`` of a weight that constant folding left as a
  view) becomes a C-contiguous copy of the same value, as an exported and re-imported
  model holds it anyway.

A weight that other nodes also read in its stored layout (an embedding table tied to the
output projection) keeps it: a transposed copy would double its memory. Initializers
that are graph outputs, or defined inside subgraphs, are left alone. Weights are only
reassigned, never written in place: the :class:`~aioinfer.Model` compiled from keeps its
own (so while the application holds it, the transposed weights exist twice).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import is_op

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)


def _product(node: ir.Node) -> bool:
    """Whether ``node`` is a matrix product whose input 1 is its right operand ``B``."""
    return (
        is_op(node, "MatMul", "Gemm")
        or ops.FUSED_GEMM.matches(node)
        or ops.FUSED_MATMUL.matches(node)
    )


def _reads_transposed(node: ir.Node, index: int, rank: int) -> bool:
    """Whether ``node`` reads its input ``index``, of rank ``rank``, as ``B`` with
    ``transB=1`` (and clearing the flag after swapping the last two axes is exact)."""
    if index != 1:
        return False
    if is_op(node, "Gemm") or ops.FUSED_GEMM.matches(node):
        fits = rank == 2  # another rank is an error the kernel reports at run time
    elif ops.FUSED_MATMUL.matches(node):
        fits = rank >= 2
    else:
        return False
    flag = ops.TRANS_B.of(node)  # Gemm's transB too
    return fits and flag is not None and flag.as_int() == 1


class PrepackWeightsPass(ir.passes.InPlacePass):
    """Constant ``B`` operands of matrix products become C-contiguous in the layout the
    product reads (``transB=1`` weights transposed once, the flag cleared)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for value in list(model.graph.initializers.values()):
            tensor = value.const_value
            if tensor is None or tensor.dtype not in _FLOATS or value.is_graph_output():
                continue
            uses = value.uses()
            if not any(index == 1 and _product(node) for node, index in uses):
                continue
            array = np.asarray(tensor.numpy())
            if array.ndim < 2:
                continue
            if all(_reads_transposed(node, index, array.ndim) for node, index in uses):
                packed = np.ascontiguousarray(np.swapaxes(array, -1, -2))
                for node, _ in uses:
                    node.attributes[ops.TRANS_B.name] = ops.TRANS_B(0)
            elif not array.flags.c_contiguous:
                packed = np.ascontiguousarray(array)
            else:
                continue
            value.const_value = ir.Tensor(packed, dtype=tensor.dtype, name=value.name)
            value.shape = ir.Shape(packed.shape)
            modified = True
        return ir.passes.PassResult(model, modified=modified)
