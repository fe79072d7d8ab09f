"""Last-position logits: a decoder projects only its last position onto the vocabulary.

A decoder exported for generation (optimum's ``text-generation-with-past``) computes the
logits of every position it is fed, although generation reads only the last one. On a
prefill that costs the most: the final ``MatMul`` (``lm_head``) of a 32,000-token
vocabulary is as large as a third of a small Llama's weights, and a batch of 32 prompts
of 64 tokens writes 262 MB of logits. This pass slices the hidden states to their last
position before that ``MatMul``::

    before:  hidden [b, s, h] -> MatMul(W [h, V]) -> [Add, Mul, Tanh...] -> logits [b, s, V]
    after:   hidden [b, s, h] -> Slice(-1:, axis -2) -> MatMul(W) -> [...] -> logits [b, 1, V]

The ops allowed between the ``MatMul`` and the output are elementwise, with constant
operands of rank at most 1 (a bias, a scale, a soft cap's ``Tanh``): they act on each
position alone, so the last position's logits are the same numbers as before. A step fed
one token per row (a decode step) is unchanged. A projection already fed the last position
is left as it is, so the pass may run twice.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.errors import InvalidModelError
from aioinfer.model import Model
from aioinfer.transforms.rewrite import constant, initializer, ints, is_op, single_use


def last_position_logits(model: Model, output: str = "logits") -> Model:
    """A copy of the decoder ``model`` whose ``output`` holds the last position only
    (``[batch, 1, vocab]``; see the module): compile it for generation, where a prefill
    then computes one row of logits per sequence. ``model`` is not changed; the copy
    shares its weights.

    Raises:
        InvalidModelError: ``model`` has no output ``output``, or it is not made by a
            projection whose last position can be sliced (named).
    """
    copy = model.ir.clone()
    LastPositionPass(output)(copy)
    return Model(copy)


def slices_last_position(graph: ir.Graph, output: str = "logits") -> bool:
    """Whether :class:`LastPositionPass` can keep the last position of ``graph``'s output
    ``output`` (it has one, made by a projection the pass recognises)."""
    value = next((v for v in graph.outputs if v.name == output), None)
    return value is not None and _chain(value) is not None


PER_POSITION = frozenset({"Add", "Sub", "Mul", "Div", "Tanh", "Cast", "Identity"})
"""Ops that may follow the projection: elementwise, other operands constant (rank <= 1)."""


class LastPositionPass(ir.passes.InPlacePass):
    """Slice the last position before the projection that makes output ``output`` (see
    the module). Raises :class:`InvalidModelError` when ``output`` is not made so."""

    def __init__(self, output: str = "logits") -> None:
        super().__init__()
        self.output = output

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        value = next((v for v in graph.outputs if v.name == self.output), None)
        if value is None:
            names = ", ".join(repr(v.name) for v in graph.outputs)
            raise InvalidModelError(
                f"no output {self.output!r} to keep the last position of; outputs: {names}"
            )
        chain = _chain(value)
        if chain is None:
            raise InvalidModelError(
                f"output {self.output!r} is not a MatMul by a constant [hidden, vocab] weight "
                "of [batch, sequence, hidden] states, followed only by elementwise ops with "
                "constant operands: its last position cannot be sliced before the projection"
            )
        projection = chain[0]
        hidden = projection.inputs[0]
        assert hidden is not None
        if _is_last_position(hidden):
            return ir.passes.PassResult(model, modified=False)
        stem = f"{projection.name or self.output}/last_position"
        bounds = [
            initializer(graph, f"{stem}/{name}", np.array([bound], np.int64))
            for name, bound in (("starts", -1), ("ends", np.iinfo(np.int64).max), ("axes", -2))
        ]
        last = ir.node("Slice", [hidden, *bounds], name=f"{stem}/Slice")
        last.outputs[0].name = f"{stem}/hidden"
        graph.insert_before(projection, last)
        projection.replace_input_with(0, last.outputs[0])
        for node in chain:
            for produced in node.outputs:
                produced.shape = _one_position(produced.shape)
        return ir.passes.PassResult(model, modified=True)


def _chain(value: ir.Value) -> list[ir.Node] | None:
    """The projection ``MatMul`` and the per-position ops from it to ``value``, in graph
    order; None when ``value`` is not made so, or an intermediate value has other users."""
    if value.shape is not None and len(value.shape) != 3:
        return None
    chain: list[ir.Node] = []
    while True:
        node = value.producer()
        if node is None or (chain and not single_use(value)):
            return None
        chain.insert(0, node)
        if is_op(node, "MatMul"):
            weight = constant(node.inputs[1])
            return chain if weight is not None and weight.ndim == 2 else None
        if not is_op(node, *PER_POSITION):
            return None
        operands = [(v, constant(v)) for v in node.inputs if v is not None]
        flowing = [v for v, array in operands if array is None]
        fixed = [array for _, array in operands if array is not None]
        if len(flowing) != 1 or any(array.ndim > 1 for array in fixed):
            return None
        value = flowing[0]


def _is_last_position(value: ir.Value) -> bool:
    """Whether ``value`` is a ``Slice`` of the last position of axis -2 (this pass's)."""
    node = value.producer()
    if not is_op(node, "Slice") or len(node.inputs) < 4:
        return False
    starts, ends, axes = (ints(v) for v in node.inputs[1:4])
    return starts == [-1] and axes == [-2] and ends is not None and ends[0] >= 0


def _one_position(shape: ir.Shape | None) -> ir.Shape | None:
    if shape is None or len(shape) < 2:
        return shape
    dims = list(shape)
    dims[-2] = 1
    return ir.Shape(dims)
