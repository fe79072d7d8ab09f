"""Constant folding: evaluate nodes whose inputs are all known, with the device's kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from aioinfer.opsets import node_opset
from aioinfer.transforms.output_size import declared_elements, output_elements

Evaluator = Callable[[ir.Node, int, Sequence[np.ndarray | None]], Sequence[np.ndarray]]
"""Runs one node on constant inputs: ``evaluate(node, opset, inputs) -> outputs``."""

NONDETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)
"""Operators whose outputs are not a function of their inputs: never folded, hoisted out
of a loop or computed once per input shapes."""
MAX_FOLDED_ELEMENTS = 1 << 22
"""Larger results stay computed at run time (folding them would bloat the weights). The
cap is checked before a node is computed wherever its output size can be known (see
:mod:`aioinfer.transforms.output_size`), so compiling never allocates a result it would
throw away; for other nodes, after."""


class ConstantFoldingPass(ir.passes.InPlacePass):
    """Replace nodes whose inputs are all constant by initializers holding their outputs."""

    def __init__(self, evaluate: Evaluator) -> None:
        super().__init__()
        self.evaluate = evaluate

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        opsets = model.opset_imports
        modified = False
        for node in list(graph):
            if not self._foldable(node):
                continue
            inputs = [None if v is None else v.const_value.numpy() for v in node.inputs]  # type: ignore[union-attr]
            if _too_large(node, inputs):
                continue
            opset = node_opset(node, opsets)
            try:
                outputs = self.evaluate(node, opset, inputs)
            except Exception:  # the node then runs at inference time instead
                continue
            used = [out for value, out in zip(node.outputs, outputs) if value.name]
            if not all(isinstance(out, np.ndarray) for out in used):
                continue  # a sequence (list) or an optional (None) is no initializer
            if any(out.size > MAX_FOLDED_ELEMENTS for out in used):
                continue
            for value, out in zip(node.outputs, outputs):
                if value.name == "" or out is None:
                    continue
                array = np.asarray(out)
                folded = ir.Value(
                    name=value.name,
                    shape=ir.Shape(array.shape),
                    type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                    const_value=ir.tensor(array, name=value.name),
                )
                value.name = None  # frees the name for the initializer
                graph.register_initializer(folded)
                value.replace_all_uses_with(folded, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified=modified)

    @staticmethod
    def _foldable(node: ir.Node) -> bool:
        if node.op_type in NONDETERMINISTIC or node.domain not in ("", "ai.onnx"):
            return False
        if any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for a in node.attributes.values()
        ):
            return False
        return all(v is None or v.const_value is not None for v in node.inputs)


def _too_large(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> bool:
    """Whether ``node``'s output is known, before computing it, to exceed the cap."""
    return any(
        size is not None and size > MAX_FOLDED_ELEMENTS
        for size in (output_elements(node, inputs), declared_elements(node))
    )
