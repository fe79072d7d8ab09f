"""benchmarks/numpy_floor.py: the products a run computes, and their numpy floors.

The shapes come from onnxruntime's profile of a real run; the test builds a model whose
products it knows (a convolution, a depthwise one, a Gemm and a batched MatMul) and
checks what the benchmark finds. Times are measured by the benchmark, never asserted.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks import numpy_floor


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c", "dw"], ["d"], name="dw", group=4, strides=[2, 2]),
        helper.make_node("Flatten", ["d"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "g"], ["y"], name="gemm", transB=1),
        helper.make_node("MatMul", ["m", "mb"], ["z"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "floor",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 5, 6]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        [weight("w", 4, 3, 3, 3), weight("dw", 4, 1, 3, 3), weight("g", 7, 36), weight("mb", 6, 9)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_products_of_a_run_and_their_shapes():
    feeds = {
        "x": np.ones((1, 3, 8, 8), np.float32),
        "m": np.ones((2, 5, 6), np.float32),
    }
    found = {p.op + str(p.group): p for p in numpy_floor.products(_model(), feeds)}
    assert set(found) == {"Conv1", "Conv4", "Gemm1", "MatMul1"}
    conv, depthwise = found["Conv1"], found["Conv4"]
    assert (conv.first, conv.output, conv.kernel) == ((1, 3, 8, 8), (1, 4, 8, 8), (3, 3))
    assert (depthwise.first, depthwise.output, depthwise.kernel) == (
        (1, 4, 8, 8),
        (1, 4, 3, 3),
        (3, 3),
    )
    assert (found["Gemm1"].first, found["Gemm1"].output) == ((1, 36), (1, 7))
    assert (found["MatMul1"].first, found["MatMul1"].output) == ((2, 5, 6), (2, 5, 9))
    cache: dict[tuple[numpy_floor.Product, bool], float] = {}
    floors = [numpy_floor.floor_seconds(p, cache) for p in found.values()]
    assert all(0 < floor < 1 for floor in floors) and len(cache) == 4


def test_the_report_has_a_row_per_model(capsys):
    numpy_floor.main(["--models", "mlp", "--runs", "2"])
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    row = [line for line in out.splitlines() if line.startswith("| mlp |")]
    assert len(row) == 1 and row[0].split("|")[2].strip() == "4", out  # 4 Gemms
    assert "geometric mean of the floor ratios:" in out


def test_a_recurrent_layer_counts_its_steps():
    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("W", (1, 16, 5)), ("R", (1, 16, 4)))
    ]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm", hidden_size=4)
    graph = helper.make_graph(
        [node],
        "recurrent",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    found = numpy_floor.products(model, {"x": np.ones((3, 2, 5), np.float32)})
    assert [(p.op, p.first, p.output) for p in found] == [("LSTM", (3, 2, 5), (3, 1, 2, 4))]
    one_step = numpy_floor.floor_seconds(found[0], {})
    longer = numpy_floor.Product("LSTM", (30, 2, 5), (30, 1, 2, 4))
    assert numpy_floor.floor_seconds(longer, {}) > one_step  # ten times the steps


def test_a_stacked_lstm_layer_shares_the_calls_of_the_one_below():
    """A forward LSTM over the steps of the forward LSTM before it counts no calls of its
    own (the wavefront runs both layers' gates in the same calls); a bidirectional one,
    or one over other steps, is no stack."""
    below = numpy_floor.Product("LSTM", (30, 2, 5), (30, 1, 2, 4))
    above = numpy_floor.Product("LSTM", (30, 2, 4), (30, 1, 2, 6))
    both = numpy_floor.Product("LSTM", (30, 2, 6), (30, 2, 2, 3))
    other = numpy_floor.Product("LSTM", (20, 2, 6), (20, 1, 2, 3))
    assert numpy_floor.stacked([below, above, both, other]) == [False, True, False, False]
    assert numpy_floor.stacked([below, other]) == [False, False]
    alone = numpy_floor.floor_seconds(above, {})
    assert numpy_floor.floor_seconds(above, {}, True) < alone
