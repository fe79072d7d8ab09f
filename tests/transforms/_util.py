"""Helpers of the pass tests: apply one pass, list op types, run IR and reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx_ir.passes.common import ShapeInferencePass

import aioinfer as ai
from aioinfer.devices.cpu.compiler import evaluate_node, lower
from aioinfer.plugin.sync_request import CancelToken
from aioinfer.transforms.constant_folding import ConstantFoldingPass


def applied(model: onnx.ModelProto, *passes: ir.passes.PassBase) -> ir.Model:
    """The IR of ``model`` after ``passes`` (constant folding and shape inference first,
    as in the pipeline)."""
    ir_model = ir.serde.deserialize_model(model)
    first = [ConstantFoldingPass(evaluate_node), ShapeInferencePass(strict_mode=False)]
    ir.passes.PassManager([*first, *passes])(ir_model)
    return ir_model


def op_types(model: onnx.ModelProto | ir.Model) -> list[str]:
    """The op types of the main graph's nodes, in order."""
    if isinstance(model, onnx.ModelProto):
        return [n.op_type for n in model.graph.node]
    return [n.op_type for n in model.graph]


def constant_node(name: str, value: np.ndarray) -> onnx.NodeProto:
    """A Constant node giving ``value`` as ``name``."""
    return oh.make_node("Constant", [], [name], value=onh.from_array(value))


def loop_body_op_types(model: onnx.ModelProto) -> list[str]:
    """The op types of the body of the first Loop of ``model`` compiled for the CPU."""
    compiled = ai.Core().compile_model(model, "CPU")
    loop = next(n for n in compiled.graph if n.op_type == "Loop")
    return [n.op_type for n in loop.attributes["body"].as_graph()]


def run_ir(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run an IR model as it is (no further passes) on the CPU plan."""
    graph = model.graph
    inputs = [feeds[v.name] for v in graph.inputs if v.name not in graph.initializers]
    return list(lower(graph, model.opset_imports).run(inputs, CancelToken()))


def run_compiled(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    config: Mapping[str, object] | None = None,
) -> list[np.ndarray]:
    """Compile ``model`` for the CPU (every pass) and run it once."""
    compiled = ai.Core().compile_model(model, "CPU", dict(config or {}))
    return list(compiled.create_infer_request().infer_sync(feeds).to_tuple())


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the onnx package's reference evaluator."""
    return list(ReferenceEvaluator(model).run(None, dict(feeds)))


def assert_close(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    """Same number of outputs, each with the same shape and close values."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
