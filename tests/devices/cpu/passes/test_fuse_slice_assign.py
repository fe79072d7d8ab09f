"""FuseSliceAssignPass: paddle2onnx's tensor-array write becomes one SliceAssign node."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.passes.fuse_slice_assign import FuseSliceAssignPass
from aioinfer.errors import InferenceError
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    constant_node,
    loop_body_op_types,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(18)


def _write(
    arr: str, value: str, start: str, end: str, out: str, **change: object
) -> list[onnx.NodeProto]:
    """``out = arr; out[:, start:min(end, len)] = value`` for a rank-3 ``arr``, node for
    node as paddle2onnx writes it (axis 1); ``change`` alters one piece (a near miss)."""
    axis = int(change.get("axis", 1))

    def c(name: str, default: list[int]) -> np.ndarray:
        return np.array(change.get(name, default), np.int64)

    return [
        constant_node("c_axis", c("axis_const", [axis])),
        constant_node("c_gather", np.array([axis], np.int64)),
        constant_node("c_step", c("step", [1])),
        constant_node("c_unsq", np.array([axis], np.int64)),
        constant_node("c_shape", c("reshape", [1, -1, 1])),
        constant_node("c_one", np.array([1], np.int64)),
        constant_node("c_s0", np.array([0], np.int64)),
        constant_node("c_e0", np.array([1], np.int64)),
        constant_node("c_s2", np.array([2], np.int64)),
        constant_node("c_e2", np.array([3], np.int64)),
        constant_node("c_ax0", np.array([0], np.int64)),
        constant_node("c_delta", np.array(change.get("delta", 1), np.int64)),
        oh.make_node("Shape", [arr], ["len_shape"]),
        oh.make_node("Gather", ["len_shape", "c_gather"], ["len"], axis=0),
        oh.make_node("Min", ["len", end], ["bound"]),
        oh.make_node("Slice", [arr, start, "bound", "c_axis", "c_step"], ["sliced"]),
        oh.make_node("Shape", ["sliced"], ["sliced_shape"]),
        oh.make_node("Unsqueeze", [value, "c_unsq"], ["value_wide"]),
        oh.make_node("Expand", ["value_wide", "sliced_shape"], ["updates"]),
        oh.make_node("Squeeze", [start], ["start_scalar"]),
        oh.make_node("Squeeze", ["bound"], ["bound_scalar"]),
        oh.make_node("Range", ["start_scalar", "bound_scalar", "c_delta"], ["positions"]),
        oh.make_node("Reshape", ["positions", "c_shape"], ["column"]),
        oh.make_node("Slice", ["sliced_shape", "c_s0", "c_e0", "c_ax0"], ["dim0"]),
        oh.make_node("Slice", ["sliced_shape", "c_s2", "c_e2", "c_ax0"], ["dim2"]),
        oh.make_node("Concat", ["dim0", "c_one", "dim2"], ["repeats"], axis=0),
        oh.make_node("Tile", ["column", "repeats"], ["indices"]),
        oh.make_node(
            "ScatterElements",
            [arr, "indices", "updates"],
            [out],
            axis=axis,
            **({"reduction": change["reduction"]} if "reduction" in change else {}),
        ),
    ]


def _top_level(**change: object) -> onnx.ModelProto:
    extra = [tensor_info("bound", np.int64, [1])] if change.pop("bound_output", False) else []
    return make_model(
        _write("arr", "value", "start", "end", "out", **change),
        [
            tensor_info("arr", np.float32, [2, 7, 5]),
            tensor_info("value", np.float32, [2, 5]),
            tensor_info("start", np.int64, [1]),
            tensor_info("end", np.int64, [1]),
        ],
        [tensor_info("out", np.float32, [2, 7, 5]), *extra],
        opsets={"": 17},
    )


def _feeds(start: int, end: int) -> dict[str, np.ndarray]:
    return {
        "arr": RNG.standard_normal((2, 7, 5)).astype(np.float32),
        "value": RNG.standard_normal((2, 5)).astype(np.float32),
        "start": np.array([start], np.int64),
        "end": np.array([end], np.int64),
    }


@pytest.mark.parametrize(
    ("start", "end"),
    [(0, 1), (3, 4), (6, 7), (2, 5), (5, 99), (7, 8), (9, 10), (4, 2), (-3, -2), (-7, -5)],
)
def test_the_write_becomes_one_node_and_copies_exactly(start: int, end: int) -> None:
    """One element, several, clipped at the end, past the end and empty (nothing
    written), negative bounds whose range matches the slice: the same bits as
    onnx.reference's ScatterElements."""
    model = _top_level()
    after = applied(model, FuseSliceAssignPass())
    assert op_types(after) == ["SliceAssign"]
    feeds = _feeds(start, end)
    want = run_reference(model, feeds)
    np.testing.assert_array_equal(run_ir(after, feeds)[0], want[0])
    np.testing.assert_array_equal(run_compiled(model, feeds)[0], want[0])


def test_a_range_that_does_not_match_its_slice_fails_as_scatter_elements_does() -> None:
    """start -1, end 0: Range gives one index, the Slice none; the unfused nodes fail
    on the shapes, the fused node on the counts."""
    model = _top_level()
    feeds = _feeds(-1, 0)
    unfused = applied(model)
    assert "ScatterElements" in op_types(unfused)
    with pytest.raises(InferenceError, match="ScatterElements"):
        run_ir(unfused, feeds)
    with pytest.raises(InferenceError, match="SliceAssign"):
        run_ir(applied(model, FuseSliceAssignPass()), feeds)


@pytest.mark.parametrize(
    "change",
    [
        {"step": [2]},
        {"delta": 2},
        {"reshape": [1, 1, -1]},
        {"axis_const": [2]},
        {"reduction": "add"},
        {"bound_output": True},
    ],
    ids=["slice-step", "range-step", "reshape", "slice-axis", "reduction", "bound-read"],
)
def test_near_misses_stay_unfused(change: dict[str, object]) -> None:
    """A Slice step of 2, a Range step of 2, indices along another axis, a Slice along
    another axis than the scatter's, a reduction, an intermediate read elsewhere: not
    this pattern."""
    after = applied(_top_level(**change), FuseSliceAssignPass())
    assert "SliceAssign" not in op_types(after)
    assert "ScatterElements" in op_types(after)


def _decoder_loop() -> onnx.ModelProto:
    """A paddle2onnx-style decoder Loop: a carried int64 counter ``i`` ([1]), the write
    ``out[:, i:i+1] = value`` with ``i+1`` computed through float as paddle2onnx does,
    and a value that changes every iteration."""
    body = oh.make_graph(
        [
            constant_node("one_f", np.array([1.0], np.float32)),
            constant_node("one_i", np.array([1], np.int64)),
            oh.make_node("Cast", ["i_in"], ["i_f"], to=onnx.TensorProto.FLOAT),
            oh.make_node("Add", ["i_f", "one_f"], ["next_f"]),
            oh.make_node("Cast", ["next_f"], ["next"], to=onnx.TensorProto.INT64),
            oh.make_node("Mul", ["step_value", "i_f"], ["value"]),
            *_write("arr_in", "value", "i_in", "next", "arr_out"),
            oh.make_node("Add", ["i_in", "one_i"], ["i_out"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            tensor_info("iteration", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("i_in", np.int64, [1]),
            tensor_info("arr_in", np.float32, ["batch", 7, 5]),
        ],
        [
            tensor_info("cond_out", np.bool_, []),
            tensor_info("i_out", np.int64, [1]),
            tensor_info("arr_out", np.float32, ["batch", 7, 5]),
        ],
    )
    return make_model(
        [oh.make_node("Loop", ["n", "go", "i0", "arr"], ["i_last", "out"], body=body)],
        [
            tensor_info("n", np.int64, []),
            tensor_info("go", np.bool_, []),
            tensor_info("i0", np.int64, [1]),
            tensor_info("arr", np.float32, ["batch", 7, 5]),
            tensor_info("step_value", np.float32, ["batch", 5]),
        ],
        [tensor_info("i_last", np.int64, [1]), tensor_info("out", np.float32, ["batch", 7, 5])],
        opsets={"": 17},
    )


def test_the_write_in_a_loop_body_is_fused_and_gives_the_same_bits() -> None:
    """Inside a Loop (the pass runs on bodies): the body holds a SliceAssign and no
    ScatterElements; nine iterations over seven positions (the last two write nothing)
    give onnx.reference's bits."""
    model = _decoder_loop()
    body = loop_body_op_types(model)
    assert "SliceAssign" in body and "ScatterElements" not in body
    feeds = {
        "n": np.array(9, np.int64),
        "go": np.array(True),
        "i0": np.array([0], np.int64),
        "arr": RNG.standard_normal((3, 7, 5)).astype(np.float32),
        "step_value": RNG.standard_normal((3, 5)).astype(np.float32),
    }
    assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=0, atol=0)
