"""The order in which passes run when a model is compiled."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import common

from aioinfer.transforms.constant_folding import ConstantFoldingPass, Evaluator


def compile_passes(evaluate: Evaluator) -> ir.passes.PassManager:
    """The pass pipeline of a float device whose kernels ``evaluate`` constant nodes."""
    return ir.passes.PassManager(
        [
            common.InlinePass(),
            common.RemoveUnusedFunctionsPass(),
            common.TopologicalSortPass(),
            ConstantFoldingPass(evaluate),
            common.RemoveUnusedNodesPass(),
            common.TopologicalSortPass(),
        ]
    )
