"""Loop-carried values that never change are read from outside the loop.

paddle2onnx passes a decoder's weights through a Loop as carried variables: each body
output ``k`` is its input ``k`` itself, so every iteration carries the weights along,
and inside the body they are ordinary inputs, not constants: nothing that reads them
folds, fuses or gets its weights prepacked (SLANet's attention decoder, 501 iterations
of 166 nodes). :class:`LoopInvariantsPass` makes the body read the Loop's initial value
of such a variable instead, an initializer of the enclosing graph when the weights are
constant, so the subgraph passes that run next (see :mod:`.subgraphs`) treat them as
the constants they are. The variable stays carried (the body's output is unchanged).
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.transforms.rewrite import is_op


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
