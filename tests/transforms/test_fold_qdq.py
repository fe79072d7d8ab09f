"""FoldQuantizedWeightsPass: dequantized constant weights become float weights; quantized
models run natively."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime  # noqa: F401  (the test extra has it; the reference below is onnx's)

from aioinfer.devices.cpu.compiler import evaluate_node
from aioinfer.transforms.fold_qdq import FoldQuantizedWeightsPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import assert_close, op_types, run_compiled, run_ir, run_reference

RNG = np.random.default_rng(8)


def _qdq_model() -> object:
    """An int8 weight dequantized per channel, a float weight quantized and dequantized,
    and an activation Q/DQ pair (which stays)."""
    weights = {
        "wq": RNG.integers(-127, 127, (6, 4)).astype(np.int8),
        "ws": RNG.uniform(0.01, 0.05, 4).astype(np.float32),
        "wz": np.zeros(4, np.int8),
        "wf": RNG.standard_normal((4, 3)).astype(np.float32),
        "fs": np.array(0.02, np.float32),
        "fz": np.array(0, np.int8),
        "xs": np.array(0.05, np.float32),
        "xz": np.array(3, np.uint8),
    }
    nodes = [
        oh.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w1"], axis=1),
        oh.make_node("QuantizeLinear", ["wf", "fs", "fz"], ["wfq"]),
        oh.make_node("DequantizeLinear", ["wfq", "fs", "fz"], ["w2"]),
        oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        oh.make_node("MatMul", ["xd", "w1"], ["h"]),
        oh.make_node("MatMul", ["h", "w2"], ["y"]),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 6])],
        [tensor_info("y", np.float32, [2, 3])],
        weights,
        opsets={"": 21},
    )


def test_weight_dequantization_folds_and_activation_pairs_stay() -> None:
    model = _qdq_model()
    ir_model = ir.serde.deserialize_model(model)
    FoldQuantizedWeightsPass(evaluate_node)(ir_model)
    assert op_types(ir_model) == ["QuantizeLinear", "DequantizeLinear", "MatMul", "MatMul"]
    folded = ir_model.graph.initializers["w1"].const_value.numpy()
    assert folded.dtype == np.float32
    x = RNG.uniform(-1, 1, (2, 6)).astype(np.float32)
    want = run_reference(model, {"x": x})
    assert_close(run_ir(ir_model, {"x": x}), want)
    assert_close(run_compiled(model, {"x": x}), want)


def test_qlinear_model_runs_natively() -> None:
    """QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger, DynamicQuantizeLinear."""
    weights = {
        "s": np.array(0.02, np.float32),
        "z": np.array(128, np.uint8),
        "w": RNG.integers(0, 255, (4, 4)).astype(np.uint8),
        "cw": RNG.integers(0, 255, (2, 1, 3, 3)).astype(np.uint8),
        "ys": np.array(0.05, np.float32),
        "yz": np.array(120, np.uint8),
    }
    nodes = [
        oh.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        oh.make_node("QLinearMatMul", ["xq", "s", "z", "w", "s", "z", "ys", "yz"], ["mq"]),
        oh.make_node("MatMulInteger", ["xq", "w", "z", "z"], ["mi"]),
        oh.make_node("Unsqueeze", ["mq", "axes"], ["img"]),
        oh.make_node(
            "QLinearConv",
            ["img", "ys", "yz", "cw", "s", "z", "ys", "yz"],
            ["cq"],
            pads=[1, 1, 1, 1],
        ),
        oh.make_node("ConvInteger", ["img", "cw", "yz", "z"], ["ci"]),
        oh.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
        oh.make_node("DynamicQuantizeLinear", ["y"], ["dq", "dqs", "dqz"]),
    ]
    weights["axes"] = np.array([0, 1], np.int64)
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [4, 4])],
        [
            tensor_info("y", np.float32, [1, 2, 4, 4]),
            tensor_info("mi", np.int32, [4, 4]),
            tensor_info("ci", np.int32, [1, 2, 4, 4]),
            tensor_info("dq", np.uint8, [1, 2, 4, 4]),
            tensor_info("dqs", np.float32, []),
        ],
        weights,
        opsets={"": 21},
    )
    x = RNG.uniform(-2, 2, (4, 4)).astype(np.float32)
    got = run_compiled(model, {"x": x})
    want = run_reference(model, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), atol=1e-6)
