"""FuseGRUGatesPass: a GRU cell written out node by node becomes one GRUGates node."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.passes.fuse_gru_cell import FuseGRUGatesPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    loop_body_op_types,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(7)
INPUT, HIDDEN = 6, 5


def _cell(x: str, h: str, out: str, **change: object) -> list[onnx.NodeProto]:
    """paddle2onnx's GRUCell (gates r, z, c in this order), node for node; ``change``
    alters one piece (a near miss)."""
    reset, update = change.get("gates", (0, 1))
    sub = ["tanh_c", h] if change.get("sub_reversed") else [h, "tanh_c"]
    split = {"split": change["split"]} if "split" in change else {}
    return [
        oh.make_node("Gemm", [x, "w", "bw"], ["gx"]),
        oh.make_node("Gemm", [h, "u", "bu"], ["gh"]),
        oh.make_node("Split", ["gx"], ["x0", "x1", "x2"], axis=1, **split),
        oh.make_node("Split", ["gh"], ["h0", "h1", "h2"], axis=1, **split),
        oh.make_node("Add", [f"x{reset}", f"h{reset}"], ["sum_r"]),
        oh.make_node("Sigmoid", ["sum_r"], ["r"]),
        oh.make_node("Add", [f"h{update}", f"x{update}"], ["sum_z"]),
        oh.make_node("Sigmoid", ["sum_z"], ["z"]),
        oh.make_node("Mul", ["r", "h2"], ["gated"]),
        oh.make_node("Add", ["x2", "gated"], ["sum_c"]),
        oh.make_node("Tanh", ["sum_c"], ["tanh_c"]),
        oh.make_node("Sub", sub, ["diff"]),
        oh.make_node("Mul", ["diff", "z"], ["kept"]),
        oh.make_node("Add", ["kept", "tanh_c"], [out]),
    ]


def _weights(dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {
        "w": (RNG.standard_normal((INPUT, 3 * HIDDEN)) * 0.5).astype(dtype),
        "u": (RNG.standard_normal((HIDDEN, 3 * HIDDEN)) * 0.5).astype(dtype),
        "bw": (RNG.standard_normal(3 * HIDDEN) * 0.1).astype(dtype),
        "bu": (RNG.standard_normal(3 * HIDDEN) * 0.1).astype(dtype),
    }


def _top_level(dtype: type = np.float32, **change: object) -> onnx.ModelProto:
    extra = (
        [tensor_info("x1", dtype, ["batch", HIDDEN])] if change.pop("split_output", False) else []
    )
    return make_model(
        _cell("x", "h", "h_new", **change),
        [tensor_info("x", dtype, ["batch", INPUT]), tensor_info("h", dtype, ["batch", HIDDEN])],
        [tensor_info("h_new", dtype, ["batch", HIDDEN]), *extra],
        _weights(dtype),
        opsets={"": 12},
    )


def _feeds(batch: int = 3, dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {
        "x": (RNG.standard_normal((batch, INPUT)) * 2).astype(dtype),
        "h": RNG.standard_normal((batch, HIDDEN)).astype(dtype),
    }


def test_the_cell_becomes_two_gemms_and_one_node_with_the_same_bits() -> None:
    """Twelve nodes after the products become GRUGates; its output has exactly the bits
    of the unfused nodes on the same kernels, and is within float32 rounding of
    onnx.reference (rtol 1e-5, atol 1e-6)."""
    model = _top_level()
    after = applied(model, FuseGRUGatesPass())
    assert op_types(after) == ["Gemm", "Gemm", "GRUGates"]
    for batch in (1, 3):
        feeds = _feeds(batch)
        unfused = run_ir(applied(model), feeds)
        np.testing.assert_array_equal(run_ir(after, feeds)[0], unfused[0])
        want = run_reference(model, feeds)
        assert_close(run_ir(after, feeds), want, rtol=1e-5, atol=1e-6)
        assert_close(run_compiled(model, feeds), want, rtol=1e-5, atol=1e-6)


def test_a_hidden_state_of_one_row_broadcasts_as_the_nodes_do() -> None:
    """h of one row against three rows of x: the Adds and Muls broadcast, so does the
    fused kernel (same bits as the unfused nodes)."""
    model = _top_level()
    feeds = {"x": _feeds(3)["x"], "h": _feeds(1)["h"]}
    unfused = run_ir(applied(model), feeds)[0]
    fused = run_ir(applied(model, FuseGRUGatesPass()), feeds)[0]
    assert fused.shape == (3, HIDDEN)
    np.testing.assert_array_equal(fused, unfused)


@pytest.mark.parametrize(
    "change",
    [
        {"gates": (1, 0)},
        {"sub_reversed": True},
        {"split": [5, 5, 5], "split_output": True},
        {"split": [4, 6, 5]},
    ],
    ids=["gates-swapped", "sub-reversed", "split-read-elsewhere", "unequal-split"],
)
def test_near_misses_stay_unfused(change: dict[str, object]) -> None:
    """The update gate where the reset gate should be, ``c - h``, a Split output that is
    also a graph output, unequal thirds: not this cell."""
    after = applied(_top_level(**change), FuseGRUGatesPass())
    assert "GRUGates" not in op_types(after)


def test_a_half_precision_cell_stays_unfused() -> None:
    """float16 Sigmoids compute in float32 (the kernel widens them): not fused."""
    after = applied(_top_level(np.float16), FuseGRUGatesPass())
    assert "GRUGates" not in op_types(after)


def _decoder_loop() -> onnx.ModelProto:
    """A Loop whose body runs the cell on a per-iteration input, carrying h."""
    body = oh.make_graph(
        [
            oh.make_node("Cast", ["iteration"], ["i_f"], to=onnx.TensorProto.FLOAT),
            oh.make_node("Mul", ["x", "i_f"], ["x_i"]),
            *_cell("x_i", "h_in", "h_out"),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            tensor_info("iteration", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("h_in", np.float32, ["batch", HIDDEN]),
        ],
        [
            tensor_info("cond_out", np.bool_, []),
            tensor_info("h_out", np.float32, ["batch", HIDDEN]),
        ],
    )
    return make_model(
        [oh.make_node("Loop", ["n", "go", "h"], ["h_last"], body=body)],
        [
            tensor_info("n", np.int64, []),
            tensor_info("go", np.bool_, []),
            tensor_info("h", np.float32, ["batch", HIDDEN]),
            tensor_info("x", np.float32, ["batch", INPUT]),
        ],
        [tensor_info("h_last", np.float32, ["batch", HIDDEN])],
        _weights(),
        opsets={"": 12},
    )


def test_the_cell_in_a_loop_body_is_fused() -> None:
    """Inside a Loop (the pass runs on bodies): the body holds GRUGates and no Sigmoid;
    six iterations agree with onnx.reference (float32: rtol 1e-5, atol 1e-6)."""
    model = _decoder_loop()
    body = loop_body_op_types(model)
    assert "GRUGates" in body and "Sigmoid" not in body
    feeds = {"n": np.array(6, np.int64), "go": np.array(True), **_feeds(2)}
    assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-6)
