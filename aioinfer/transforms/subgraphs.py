"""Run graph passes inside the bodies of If, Loop and Scan too.

Our passes visit the nodes of ``model.graph`` only. Exporters put whole models inside
control flow (Silero VAD's network sits in both branches of an If over the sample
rate; SLANet's attention decoder in a Loop body), and there every ``Constant``, every
weight ``Slice``/``Concat`` and every unfused Conv + BatchNorm ran at each inference: on
Silero VAD, 121 nodes in the taken branch (0.74 ms) where folding leaves about 60.

:class:`SubgraphsPass` runs the given passes on each subgraph as if it were the main
graph of a model (the model's opset imports in force, its IR version); the opset imports
a pass adds on the way (the fused operators' domain) are added to the model's. A value a
body reads from an enclosing graph is a constant there when it is an initializer of
that graph, so weights captured by a body fold like the body's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

SUBGRAPH_KEY = "aioinfer.subgraph"
"""Set (True) in ``graph.meta`` while the passes run on a subgraph as if it were a main
graph: a pass that must not touch a main graph's named outputs may touch a subgraph's,
which are positional."""


class SubgraphsPass(ir.passes.InPlacePass):
    """Apply ``passes`` (in order) to every subgraph of the model, outer ones first."""

    def __init__(self, passes: Sequence[ir.passes.PassBase]) -> None:
        super().__init__()
        self.passes = list(passes)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for graph in list(model.graph.subgraphs()):
            own = dict(graph.opset_imports)
            graph.opset_imports.update(model.opset_imports)
            graph.meta[SUBGRAPH_KEY] = True
            body = ir.Model(graph, ir_version=model.ir_version)
            try:
                for graph_pass in self.passes:
                    modified |= graph_pass(body).modified
            finally:
                for domain, version in graph.opset_imports.items():
                    model.opset_imports.setdefault(domain, version)
                graph.opset_imports.clear()
                graph.opset_imports.update(own)
                del graph.meta[SUBGRAPH_KEY]
        return ir.passes.PassResult(model, modified=modified)
