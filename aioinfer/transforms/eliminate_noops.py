"""Remove nodes that hand their input back unchanged.

paddle2onnx writes each ``assign`` in a Loop body as ``Unsqueeze -> Add(0) -> Squeeze``:
SLANet's decoder body has eight of them, 24 of its 99 nodes after folding, run at each
of its 501 iterations. :class:`EliminateNoOpsPass` removes

- ``Add(x, 0)``, ``Sub(x, 0)``, ``Mul(x, 1)``, ``Div(x, 1)`` with a constant of x's
  dtype whose dimensions are all 1 and no more than x's rank (so it broadcasts without
  changing x's shape; for floats only the sign of a ``-0`` can differ from the node's),
- ``Squeeze(Unsqueeze(x, axes), axes)`` and ``Unsqueeze(Squeeze(x, axes), axes)`` with
  the same constant axes (a Squeeze of size-1 axes that the Unsqueeze puts back),
- ``Identity``.

A node whose output is an output of the main graph stays (the output's name is the
model's API); in a subgraph (outputs are positional) the output becomes the input,
unless that is already an output of the subgraph or a value of an enclosing graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.transforms.rewrite import constant, defined_in, is_op, producer, single_use
from aioinfer.transforms.subgraphs import SUBGRAPH_KEY

_NEUTRAL = {"Add": (0, (0, 1)), "Sub": (0, (0,)), "Mul": (1, (0, 1)), "Div": (1, (0,))}
"""op -> (the neutral element, the input positions ``x`` may take)."""


class EliminateNoOpsPass(ir.passes.InPlacePass):
    """Replace no-op nodes of the main graph by their input (see the module)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        outputs_named = not graph.meta.get(SUBGRAPH_KEY, False)
        modified = False
        for node in list(graph):
            if node.graph is not graph:
                continue  # removed with the node after it
            source = _passed_through(node)
            if source is None:
                continue
            output = node.outputs[0]
            if output.is_graph_output() and (
                outputs_named or source.is_graph_output() or not defined_in(source, graph)
            ):
                continue
            first = node.inputs[0]
            inner = first.producer() if first is not None and node.op_type in _PAIRS else None
            output.replace_all_uses_with(source, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            if inner is not None:
                graph.remove(inner, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified=modified)


_PAIRS = {"Squeeze": "Unsqueeze", "Unsqueeze": "Squeeze"}


def _passed_through(node: ir.Node) -> ir.Value | None:
    """The input that ``node`` returns unchanged, or None."""
    if is_op(node, "Identity"):
        return node.inputs[0]
    if node.op_type in _NEUTRAL and is_op(node, node.op_type) and len(node.inputs) == 2:
        neutral, positions = _NEUTRAL[node.op_type]
        for position in positions:
            x, other = node.inputs[position], node.inputs[1 - position]
            if x is None or other is None or x.dtype != other.dtype or x.shape is None:
                continue
            value = constant(other)
            if value is None or value.ndim > len(x.shape) or any(d != 1 for d in value.shape):
                continue
            if np.all(value == neutral):
                return x
        return None
    pair = _PAIRS.get(node.op_type)
    if pair is None or not is_op(node, node.op_type) or len(node.inputs) != 2:
        return None
    inner = producer(node.inputs[0], pair)
    if inner is None or len(inner.inputs) != 2 or not single_use(node.inputs[0]):
        return None
    outer_axes, inner_axes = constant(node.inputs[1]), constant(inner.inputs[1])
    if outer_axes is None or inner_axes is None or outer_axes.tolist() != inner_axes.tolist():
        return None
    if any(a < 0 for a in outer_axes.reshape(-1).tolist()):
        return None  # negative axes count from ranks that differ between the two
    return inner.inputs[0]
