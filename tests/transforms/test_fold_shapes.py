"""FoldShapesPass: Shape -> Gather -> Concat -> Reshape folds when shapes are static."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

import aioinfer as ai
from aioinfer.devices.cpu.compiler import evaluate_node
from aioinfer.transforms.constant_folding import ConstantFoldingPass
from aioinfer.transforms.fold_shapes import FoldShapesPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)


def _model(batch: int | str) -> object:
    nodes = [
        oh.make_node("Relu", ["x"], ["r"]),
        oh.make_node("Shape", ["r"], ["s"]),
        oh.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        oh.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
        oh.make_node("Reshape", ["r", "target"], ["y"]),
        oh.make_node("Size", ["x"], ["count"]),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [batch, 3, 4])],
        [tensor_info("y", np.float32, [batch, 12]), tensor_info("count", np.int64, [])],
        {"i0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)},
    )


def test_static_shapes_fold_into_a_constant_reshape() -> None:
    model = _model(2)
    assert op_types(model) == ["Relu", "Shape", "Gather", "Concat", "Reshape", "Size"]
    after = applied(model, FoldShapesPass(), ConstantFoldingPass(evaluate_node))
    assert op_types(after) == ["Relu", "Reshape"]
    target = after.graph.node(1).inputs[1]
    assert target.const_value is not None
    assert list(target.const_value.numpy()) == [2, -1]
    x = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    want = run_reference(model, {"x": x})
    assert_close(run_ir(after, {"x": x}), want)
    assert_close(run_compiled(model, {"x": x}), want)


def test_symbolic_shapes_stay_until_reshaped() -> None:
    model = _model("batch")
    after = applied(model, FoldShapesPass(), ConstantFoldingPass(evaluate_node))
    assert "Shape" in op_types(after) and "Size" in op_types(after)
    core = ai.Core()
    read = core.read_model(model)
    read.reshape({"x": [5, 3, 4]})
    compiled = core.compile_model(read, "CPU")
    assert [n.op_type for n in compiled.graph] == ["Relu", "Reshape"]
    x = np.ones((5, 3, 4), np.float32)
    results = compiled.create_infer_request().infer_sync({"x": x})
    assert results["y"].shape == (5, 12) and int(results["count"]) == 60
