"""Move a fused HardSwish's 1/6 into the weights of the convolutions that read it.

``HardSwish(y) = y * clip(y + 3, 0, 6) / 6``. When every reader of a ``FusedConv``'s
HardSwish output is a convolution taking it as its input ``X`` with constant float
weights, the ``FusedConv`` computes ``6 * HardSwish(y)`` (``activation_params`` ``[6]``:
``y * (clip(y, -3, 3) + 3)``, one numpy pass fewer over its output) and each reader
gets its own copy of its weights divided by 6: convolutions are linear in ``X`` and
pad with zeros, so their results are unchanged up to rounding. PP-LCNet (MobileNetV3
and PP-LCNet's blocks) chains such convolutions: its HardSwish epilogues are four passes
over maps of up to 32x112x112, the scale one of them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import RewritePass, constant, initializer, is_op


def _weights_of_reader(node: ir.Node, value: ir.Value) -> tuple[ir.Value, np.ndarray] | None:
    """The constant float weights (value and array) of ``node`` when it is a convolution
    that reads ``value`` as its input ``X`` only, else None."""
    if not (is_op(node, "Conv") or ops.FUSED_CONV.matches(node)):
        return None
    inputs = list(node.inputs)
    if len(inputs) < 2 or inputs[0] is not value or any(v is value for v in inputs[1:]):
        return None
    weights = constant(inputs[1])
    if inputs[1] is None or weights is None or weights.dtype not in (np.float32, np.float64):
        return None
    return inputs[1], weights


class FoldHardSwishScalePass(RewritePass):
    """A ``FusedConv`` with a HardSwish read only by convolutions with constant weights
    leaves its 1/6 to their weights."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not ops.FUSED_CONV.matches(node):
            return False
        activation = ops.ACTIVATION.of(node)
        if activation is None or activation.as_string() != ops.Activation.HARD_SWISH:
            return False
        if ops.ACTIVATION_PARAMS.of(node) is not None:
            return False  # already folded
        output = node.outputs[0]
        readers = list(dict.fromkeys(use.node for use in output.uses()))
        if output.is_graph_output() or not readers:
            return False
        scaled: list[tuple[ir.Node, ir.Value, np.ndarray]] = []
        for reader in readers:
            found = _weights_of_reader(reader, output)
            if found is None or reader.graph is not graph:
                return False
            scaled.append((reader, *found))
        for reader, value, weights in scaled:  # each its own copy: W may be shared
            sixth = weights / weights.dtype.type(ops.HARD_SWISH_SCALE)
            reader.replace_input_with(1, initializer(graph, f"{value.name}_sixth", sixth))
        node.attributes[ops.ACTIVATION_PARAMS.name] = ops.ACTIVATION_PARAMS([ops.HARD_SWISH_SCALE])
        return True
