"""Fold shape computations whose result is known once shapes are static.

Exporters compute reshape targets at run time (``Shape -> Gather -> Concat -> Reshape``).
After onnx shape inference (:class:`onnx_ir.passes.common.ShapeInferencePass`), a
``Shape`` or ``Size`` of a value whose shape is fully static is replaced by a constant;
constant folding, which runs next in the pipeline, then folds the Gathers, Concats and
the like that consumed it, so that the Reshape gets a constant target.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from aioinfer.transforms.rewrite import initializer, is_op


def _static_dims(value: ir.Value | None) -> list[int] | None:
    if value is None or value.shape is None:
        return None
    dims = list(value.shape)
    return dims if all(isinstance(d, int) for d in dims) else None  # type: ignore[return-value]


def _shape_slice(node: ir.Node, dims: list[int]) -> list[int]:
    """The part of ``dims`` a Shape node returns (``start``/``end`` from opset 15)."""
    start = node.attributes.get("start")
    end = node.attributes.get("end")
    rank = len(dims)
    first = 0 if start is None else start.as_int()
    last = rank if end is None else end.as_int()
    first = min(max(first + rank if first < 0 else first, 0), rank)
    last = min(max(last + rank if last < 0 else last, 0), rank)
    return dims[first:last]


class FoldShapesPass(ir.passes.InPlacePass):
    """Infer shapes, then replace Shape/Size of statically shaped values by constants.

    ``infer=False`` skips the inference and uses the shapes the values already carry (a
    subgraph, whose shapes the main graph's inference filled in, cannot be inferred on
    its own: it reads values of the enclosing graph).
    """

    def __init__(self, infer: bool = True) -> None:
        super().__init__()
        self.infer = infer

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if self.infer:
            ShapeInferencePass(check_type=False, strict_mode=False)(model)
        graph = model.graph
        modified = False
        for node in list(graph):
            if not is_op(node, "Shape", "Size"):
                continue
            dims = _static_dims(node.inputs[0])
            if dims is None:
                continue
            if node.op_type == "Shape":
                array = np.array(_shape_slice(node, dims), dtype=np.int64)
            else:
                array = np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
            output = node.outputs[0]
            name, output.name = output.name or f"{node.op_type}_folded", None
            folded = initializer(graph, name, array)
            output.replace_all_uses_with(folded, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified=modified)
