"""The order in which the CPU device's passes (and the shared ones) run when a model is
compiled."""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir
from onnx_ir.passes import common

from aioinfer.devices.cpu.passes.fold_hardswish_scale import FoldHardSwishScalePass
from aioinfer.devices.cpu.passes.fold_one_hot import FoldOneHotMatMulPass
from aioinfer.devices.cpu.passes.fold_transpose import FoldTransposePass
from aioinfer.devices.cpu.passes.fuse_activation import FuseActivationPass
from aioinfer.devices.cpu.passes.fuse_attention import FuseAttentionPass
from aioinfer.devices.cpu.passes.fuse_counters import FuseCountersPass
from aioinfer.devices.cpu.passes.fuse_gelu import FuseGeluPass
from aioinfer.devices.cpu.passes.fuse_gru_cell import FuseGRUGatesPass
from aioinfer.devices.cpu.passes.fuse_layernorm import FuseLayerNormPass
from aioinfer.devices.cpu.passes.fuse_lstm_stack import FuseLSTMStackPass
from aioinfer.devices.cpu.passes.fuse_slice_assign import FuseSliceAssignPass
from aioinfer.devices.cpu.passes.matmul_add import FuseMatMulAddPass
from aioinfer.devices.cpu.passes.prepack_weights import PrepackWeightsPass
from aioinfer.transforms.constant_folding import ConstantFoldingPass, Evaluator
from aioinfer.transforms.eliminate_noops import EliminateNoOpsPass
from aioinfer.transforms.fold_batchnorm import FoldBatchNormPass
from aioinfer.transforms.fold_qdq import FoldQuantizedWeightsPass
from aioinfer.transforms.fold_shapes import FoldShapesPass
from aioinfer.transforms.loop_invariants import HoistLoopInvariantsPass, LoopInvariantsPass
from aioinfer.transforms.make_stateful import MakeStatefulPass, SizeStatesPass
from aioinfer.transforms.subgraphs import SubgraphsPass


def compile_passes(
    evaluate: Evaluator, stateful: Mapping[str, str] | None = None
) -> ir.passes.PassManager:
    """The pass pipeline of a float device whose kernels ``evaluate`` constant nodes.

    ``stateful``: validated ``{input name: output name}`` pairs that become variables
    (see :func:`aioinfer.transforms.make_stateful.stateful_pairs`).
    """

    def graph_passes(infer_shapes: bool) -> list[ir.passes.PassBase]:
        return [*folding_passes(infer_shapes), *fusion_passes()]

    def folding_passes(infer_shapes: bool) -> list[ir.passes.PassBase]:
        return [
            ConstantFoldingPass(evaluate),
            FoldQuantizedWeightsPass(evaluate),
            FoldShapesPass(infer_shapes),
            ConstantFoldingPass(evaluate),  # the Gathers/Concats of the folded shapes
            EliminateNoOpsPass(),
            common.RemoveUnusedNodesPass(),
        ]

    def fusion_passes() -> list[ir.passes.PassBase]:
        return [
            # Fusions: the larger patterns first, then what remains of matmuls and convs.
            FoldBatchNormPass(),
            FuseLayerNormPass(),
            FuseGeluPass(),
            FuseAttentionPass(),
            FuseLSTMStackPass(),
            FuseSliceAssignPass(),  # paddle2onnx's tensor-array writes in decoder Loops
            FuseGRUGatesPass(),  # before FuseActivationPass takes a Sigmoid
            FuseCountersPass(),  # paddle2onnx's i + 1 through float, its bool round trips
            FoldOneHotMatMulPass(),  # before MatMul + Add become one node
            FoldTransposePass(),
            FuseMatMulAddPass(),
            FuseActivationPass(),
            FoldHardSwishScalePass(),  # after the fusions that make HardSwish epilogues
            PrepackWeightsPass(),  # after the fusions, which match weights as exported
        ]

    return ir.passes.PassManager(
        [
            common.InlinePass(),
            common.RemoveUnusedFunctionsPass(),
            common.TopologicalSortPass(),
            SizeStatesPass(stateful or {}),  # before folding and fusions hide what feeds what
            *graph_passes(infer_shapes=True),
            LoopInvariantsPass(),  # so that the weights a Loop carries fold in its body
            # The bodies of If/Loop/Scan, with the shapes the main graph's inference gave.
            SubgraphsPass(folding_passes(infer_shapes=False)),
            LoopInvariantsPass(),  # the carried values that no-op elimination uncovered
            HoistLoopInvariantsPass(),  # before the body's fusions hide invariant products
            SubgraphsPass(fusion_passes()),
            common.RemoveUnusedNodesPass(),
            MakeStatefulPass(stateful or {}),  # after unused-node removal: Assign is a sink
            common.TopologicalSortPass(),
        ]
    )
