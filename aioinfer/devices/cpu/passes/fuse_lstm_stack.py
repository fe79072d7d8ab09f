"""Fuse stacked unidirectional LSTM layers into one ``ai.aioinfer::LSTMStack`` node.

    LSTM(X, W1, R1, B1, -, h1, c1) -> Y1 -> Squeeze(axes=[1]) -> LSTM(., W2, R2, B2, -, h2, c2)

is what exporters write for a multi-layer LSTM (one node per layer, the direction axis
of ``Y`` squeezed away between them). The layers become one node that the CPU device
runs as a wavefront (:mod:`aioinfer.devices.cpu.kernels.lstm_stack`), three or more
layers by fusing the next one into the stack. A layer qualifies when it runs forward in
layout 0 with the default activations, without ``clip``, ``input_forget``,
``sequence_lens`` or peepholes, and its ``W`` and ``R`` (and ``B``) are constants; the
``Y`` of a lower layer must feed nothing but the ``Squeeze``, whose output feeds only
the next layer. ``Y_h`` and ``Y_c`` of every layer stay outputs of the fused node.
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    input_at,
    ints,
    is_op,
    only_use,
    producer,
    stand_for,
)

_DEFAULT_ACTIVATIONS = ["sigmoid", "tanh", "tanh"]
_STATE_INPUTS = (5, 6)  # initial_h, initial_c


def _layer_sizes(node: ir.Node) -> tuple[int, int] | None:
    """The hidden and the input size of an LSTM node that can join a stack, else None."""
    if not is_op(node, "LSTM") or len(node.inputs) > 8:
        return None
    attrs = node.attributes
    if attrs.get_string("direction", "forward") != "forward" or attrs.get_int("layout"):
        return None
    if "clip" in attrs or attrs.get_int("input_forget"):
        return None
    activations = attrs.get_strings("activations", _DEFAULT_ACTIVATIONS)
    if [str(a).lower() for a in activations] != _DEFAULT_ACTIVATIONS:
        return None
    if input_at(node, 4) is not None or input_at(node, 7) is not None:
        return None
    w, r = constant(input_at(node, 1)), constant(input_at(node, 2))
    bias = input_at(node, 3)
    if w is None or r is None or w.ndim != 3 or r.ndim != 3 or w.shape[0] != 1:
        return None
    if bias is not None and constant(bias) is None:
        return None
    hidden = r.shape[-1]
    if r.shape != (1, 4 * hidden, hidden) or w.shape[1] != 4 * hidden:
        return None
    if attrs.get_int("hidden_size", hidden) != hidden:
        return None
    return int(hidden), int(w.shape[-1])


def _squeezes_direction(squeeze: ir.Node) -> bool:
    """Whether the Squeeze removes exactly axis 1 of a rank-4 ``Y``."""
    axes = input_at(squeeze, 1)
    listed = ints(axes) if axes is not None else squeeze.attributes.get_ints("axes", None)
    return listed is not None and list(listed) in ([1], [-3])


def _layer_inputs(node: ir.Node) -> list[ir.Value | None]:
    """W, R, B, initial_h, initial_c of an LSTM node."""
    return [input_at(node, i) for i in (1, 2, 3, *_STATE_INPUTS)]


def _layer_outputs(node: ir.Node) -> list[ir.Value | None]:
    """Y_h and Y_c of an LSTM node (None where it has none)."""
    return [node.outputs[i] if i < len(node.outputs) else None for i in (1, 2)]


class FuseLSTMStackPass(RewritePass):
    """An LSTM fed by the squeezed ``Y`` of an LSTM (or of a stack) joins it."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        sizes = _layer_sizes(node)
        squeeze = producer(input_at(node, 0), "Squeeze")
        if sizes is None or squeeze is None or only_use(squeeze.outputs[0]) is not node:
            return False
        hidden, input_size = sizes
        y = squeeze.inputs[0]
        below = producer(y, "LSTM") or ops.LSTM_STACK.producer(y)
        if below is None or y is not below.outputs[0]:
            return False
        if only_use(y) is not squeeze or not _squeezes_direction(squeeze):
            return False
        if ops.LSTM_STACK.matches(below):
            inputs: list[ir.Value | None] = list(below.inputs)
            kept: list[ir.Value | None] = list(below.outputs[1:])
            hiddens = list(below.attributes.get_ints("hidden_sizes", []))
            names = list(below.attributes.get_strings("layer_names", []))
        else:
            below_sizes = _layer_sizes(below)
            if below_sizes is None:
                return False
            inputs = [below.inputs[0], *_layer_inputs(below)]
            kept = _layer_outputs(below)
            hiddens, names = [below_sizes[0]], [below.name or ""]
        if input_size != hiddens[-1]:
            return False
        fused = ops.LSTM_STACK.node(
            [*inputs, *_layer_inputs(node)],
            [
                ops.HIDDEN_SIZES([*hiddens, hidden]),
                ops.LAYER_NAMES([*names, node.name or ""]),
            ],
            num_outputs=2 + len(kept) + 1,
            name=node.name,
        )
        graph.insert_before(node, fused)
        for old, new in zip([node.outputs[0], *kept, *_layer_outputs(node)], fused.outputs):
            if old is not None:
                stand_for(old, new)
        for gone in (node, squeeze, below):
            graph.remove(gone, safe=True)
        return True
