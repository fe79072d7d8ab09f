"""Loop-carried values that never change are read from outside the loop.

paddle2onnx passes a decoder's weights through a Loop as carried variables: each body
output ``k`` is its input ``k`` itself, so every iteration carries the weights along,
and inside the body they are ordinary inputs, not constants: nothing that reads them
folds, fuses or gets its weights prepacked (SLANet's attention decoder, 501 iterations
of 166 nodes). :class:`LoopInvariantsPass` makes the body read the Loop's initial value
of such a variable instead, an initializer of the enclosing graph when the weights are
constant, so the subgraph passes that run next (see :mod:`.subgraphs`) treat them as
the constants they are. The variable stays carried (the body's output is unchanged).

:class:`HoistLoopInvariantsPass` then moves body nodes that read only values from
outside the body (weights, a carried variable's initial value) in front of the Loop: they
compute the same value in every iteration. SLANet's decoder multiplies the encoder's
features (1x3721x96) by a weight in each of its 501 iterations, 70 us each; it must run
before the body's fusions, which would fuse that product with a per-iteration ``Add``.
A hoisted node runs even when the loop runs no iteration.
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.transforms.constant_folding import NONDETERMINISTIC
from aioinfer.transforms.rewrite import is_op

"""Operators whose outputs differ between runs on the same inputs: never hoisted."""


class LoopInvariantsPass(ir.passes.InPlacePass):
    """In every Loop of the model, body reads of a pass-through carried variable read
    the Loop's initial value of it."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for graph in (model.graph, *model.graph.subgraphs()):
            for node in graph:
                if is_op(node, "Loop"):
                    modified |= _read_invariants_outside(node)
        return ir.passes.PassResult(model, modified=modified)


def _read_invariants_outside(loop: ir.Node) -> bool:
    body = loop.attributes["body"].as_graph()
    carried = len(loop.inputs) - 2
    modified = False
    for k in range(carried):
        inside, initial = body.inputs[2 + k], loop.inputs[2 + k]
        if initial is None or body.outputs[1 + k] is not inside:
            continue
        for user, index in list(inside.uses()):  # the body's output stays the input
            user.replace_input_with(index, initial)
            modified = True
    return modified


class HoistLoopInvariantsPass(ir.passes.InPlacePass):
    """In every Loop of the model, move the body nodes whose inputs all come from
    outside the body in front of the Loop (see the module)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for graph in (model.graph, *model.graph.subgraphs()):
            for node in list(graph):
                if is_op(node, "Loop"):
                    modified |= _hoist_invariants(graph, node)
        return ir.passes.PassResult(model, modified=modified)


def _hoist_invariants(graph: ir.Graph, loop: ir.Node) -> bool:
    body = loop.attributes["body"].as_graph()
    inside = set(body.inputs) | set(body.initializers.values())
    for node in body:
        inside.update(node.outputs)
    kept = set(body.outputs)
    moved = False
    for node in list(body):  # in order: a node may read one hoisted before it
        hoistable = (
            node.domain in ("", "ai.onnx")
            and node.op_type not in NONDETERMINISTIC
            and node.inputs
            and all(v is None or v not in inside for v in node.inputs)
            and not any(a.type == ir.AttributeType.GRAPH for a in node.attributes.values())
            and not any(v in kept for v in node.outputs)
        )
        if hoistable:
            body.remove(node)
            graph.insert_before(loop, node)
            inside.difference_update(node.outputs)
            moved = True
    return moved
