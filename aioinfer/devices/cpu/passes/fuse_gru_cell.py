"""Fuse the gates of a GRU cell written out node by node (paddle2onnx's ``GRUCell``).

    gx0, gx1, gx2 = Split(gx, 3 equal parts, last axis)      gx = x @ W + b (a Gemm)
    gh0, gh1, gh2 = Split(gh, 3 equal parts, last axis)      gh = h @ U + b (a Gemm)
    r = Sigmoid(gx0 + gh0);  z = Sigmoid(gx1 + gh1)
    c = Tanh(gx2 + r * gh2)
    h' = (h - c) * z + c

(the operands of each Add and Mul in either order) becomes
``ai.aioinfer::GRUGates(gx, gh, h)`` with ``hidden_size``: twelve nodes into one kernel of
eleven numpy calls computing the same operations element by element (the same float
results), both sigmoids in one pass. In SLANet's decoder Loop (501 iterations) the
twelve steps took ~30 us of an iteration. The products stay Gemms.
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    fed_by,
    input_at,
    ints,
    is_op,
    only_read_by,
    producer,
    replace,
)

"""The fused operator: ``GRUGates(gx, gh, h)`` with ``hidden_size``."""

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE)
"""Element types whose Sigmoid the kernels compute as they are (float16 is widened)."""


def _operands(node: ir.Node | None, op_type: str) -> list[tuple[ir.Value, ir.Value]]:
    """Both orders of the two operands of ``node`` when it is an ``op_type``."""
    if node is None or not is_op(node, op_type) or len(node.inputs) != 2:
        return []
    first, second = node.inputs
    if first is None or second is None:
        return []
    return [(first, second), (second, first)]


def _pick(node: ir.Node, op_type: str, source: str) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """For the binary ``op_type`` ``node``: the ``source`` node that gives one operand,
    read by ``node`` alone, that operand and the other one; None when neither is."""
    for operand, other in _operands(node, op_type):
        found = fed_by(operand, node, source)
        if found is not None:
            return found, operand, other
    return None


def _split_part(value: ir.Value, user: ir.Node) -> tuple[ir.Node, int] | None:
    """The Split that produced ``value`` and the output's index, when ``user`` is its one
    reader."""
    node = fed_by(value, user, "Split")
    if node is None:
        return None
    return node, list(node.outputs).index(value)


def _hidden_size(split: ir.Node) -> int | None:
    """H when ``split`` cuts a float array of known rank into three parts of H along the
    last axis, else None."""
    source = split.inputs[0]
    if source is None or source.shape is None or source.dtype not in _FLOATS:
        return None
    rank = len(source.shape)
    axis = split.attributes.get_int("axis", 0)
    if rank == 0 or len(split.outputs) != 3 or axis not in (-1, rank - 1):
        return None
    width = source.shape[rank - 1]
    sizes_input = input_at(split, 1)
    sizes_attr = split.attributes.get("split")
    if sizes_input is not None:
        sizes = ints(sizes_input)
    elif sizes_attr is not None:
        sizes = list(sizes_attr.as_ints())
    else:
        sizes = [width // 3] * 3 if isinstance(width, int) and width % 3 == 0 else None
    if sizes is None or len(set(sizes)) != 1 or sizes[0] <= 0:
        return None
    if isinstance(width, int) and width != 3 * sizes[0]:
        return None
    return sizes[0]


class FuseGRUGatesPass(RewritePass):
    """The gates of a written-out GRU cell, rooted at the Add that gives the new hidden
    state, become one ``GRUGates`` node."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        for product, c in _operands(node, "Add"):
            matched = self._match(node, product, c)
            if matched is not None:
                nodes, inputs, hidden = matched
                fused = ops.GRU_GATES.node(inputs, [ops.HIDDEN_SIZE(hidden)], name=node.name)
                replace(graph, [*nodes, node], fused, node.outputs[0])
                return True
        return False

    @staticmethod
    def _match(
        add: ir.Node, product: ir.Value, c: ir.Value
    ) -> tuple[list[ir.Node], list[ir.Value], int] | None:
        """The nodes (without the last Add), the inputs ``gx, gh, h`` and H."""
        # h' = (h - c) * z + c, c = Tanh(gx2 + r * gh2)
        tanh = producer(c, "Tanh")
        mul = fed_by(product, add, "Mul")
        if tanh is None or mul is None:
            return None
        picked = _pick(mul, "Mul", "Sub")
        if picked is None or picked[0].inputs[1] is not c:
            return None
        sub, _, z = picked
        h = sub.inputs[0]
        if h is None or not only_read_by(c, [sub, add]):  # both read c
            return None
        candidate = fed_by(tanh.inputs[0], tanh, "Add")
        if candidate is None:
            return None
        picked = _pick(candidate, "Add", "Mul")
        if picked is None:
            return None
        gate_mul, _, gx2 = picked
        picked = _pick(gate_mul, "Mul", "Sigmoid")
        if picked is None:
            return None
        reset, _, gh2 = picked
        update = fed_by(z, mul, "Sigmoid")
        if update is None:
            return None
        parts = [_split_part(gx2, candidate), _split_part(gh2, gate_mul)]
        if parts[0] is None or parts[1] is None or parts[0][1] != 2 or parts[1][1] != 2:
            return None
        split_x, split_h = parts[0][0], parts[1][0]
        sums = []
        for index, sigmoid in ((0, reset), (1, update)):
            total = sigmoid.inputs[0]
            adder = fed_by(total, sigmoid, "Add")
            if adder is None:
                return None
            found = [
                (a, b)
                for a, b in _operands(adder, "Add")
                if _split_part(a, adder) == (split_x, index)
                and _split_part(b, adder) == (split_h, index)
            ]
            if not found:
                return None
            sums.append(adder)
        hidden = _hidden_size(split_x)
        if split_x is split_h or hidden is None or _hidden_size(split_h) != hidden:
            return None
        gx, gh = split_x.inputs[0], split_h.inputs[0]
        assert gx is not None and gh is not None
        if gx.dtype != gh.dtype or h.dtype != gx.dtype:
            return None
        nodes = [split_x, split_h, *sums, reset, update, gate_mul, candidate, tanh, sub, mul]
        return nodes, [gx, gh, h], hidden
