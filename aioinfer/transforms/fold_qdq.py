"""Fold quantized weights into float weights (low precision on a float device).

A ``DequantizeLinear`` whose inputs are all constant (a quantized weight, its scale and
zero point), or a ``QuantizeLinear -> DequantizeLinear`` pair on a constant float weight,
is evaluated once at compile time and replaced by the float weight it produces. Unlike
general constant folding there is no size limit: the folded weight replaces the quantized
one. Quantize/dequantize pairs on activations stay (they change values: they are the
model's quantization), and run natively.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.opsets import node_opset
from aioinfer.transforms.constant_folding import Evaluator
from aioinfer.transforms.rewrite import constant, initializer, is_op


class FoldQuantizedWeightsPass(ir.passes.InPlacePass):
    """Evaluate Q/DQ nodes on constant inputs; their outputs become initializers."""

    def __init__(self, evaluate: Evaluator) -> None:
        super().__init__()
        self.evaluate = evaluate

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        modified = False
        for node in list(graph):
            if not is_op(node, "QuantizeLinear", "DequantizeLinear"):
                continue
            inputs = [constant(v) for v in node.inputs]
            if any(x is None and v is not None for x, v in zip(inputs, node.inputs)):
                continue
            try:
                outputs = self.evaluate(node, node_opset(node, model.opset_imports), inputs)
            except Exception:  # the node runs at inference time and reports its error there
                continue
            output = node.outputs[0]
            name, output.name = output.name or node.op_type, None
            folded = initializer(graph, name, np.asarray(outputs[0]))
            output.replace_all_uses_with(folded, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified=modified)
