"""FuseCountersPass: paddle2onnx's ``i + 1`` through float becomes one CastAdd node (one
per counter in a body), its bool round trips through int64 disappear."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.passes.fuse_counters import FuseCountersPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    constant_node,
    loop_body_op_types,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

FLOAT, DOUBLE = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
INT64, BOOL = onnx.TensorProto.INT64, onnx.TensorProto.BOOL


def _plus_one(x: str, out: str, tag: str, via: int = FLOAT) -> list[onnx.NodeProto]:
    """``out = Cast(Cast(x, via) + 1, INT64)`` as paddle2onnx writes it."""
    one = np.array([1.0], np.float32 if via == FLOAT else np.float64)
    return [
        constant_node(f"one_{tag}", one),
        oh.make_node("Cast", [x], [f"wide_{tag}"], to=via),
        oh.make_node("Add", [f"wide_{tag}", f"one_{tag}"], [f"sum_{tag}"]),
        oh.make_node("Cast", [f"sum_{tag}"], [out], to=INT64),
    ]


def _top_level(via: int = FLOAT, wide_output: bool = False) -> onnx.ModelProto:
    extra = [tensor_info("wide_a", np.float32, [1])] if wide_output else []
    return make_model(
        _plus_one("x", "y", "a", via),
        [tensor_info("x", np.int64, [1])],
        [tensor_info("y", np.int64, [1]), *extra],
        opsets={"": 17},
    )


@pytest.mark.parametrize("x", [0, 7, -3, 500, 2**24 + 1, -(2**40) - 1])
def test_plus_one_through_float_becomes_one_node_with_the_same_values(x: int) -> None:
    """Small counters, and values that float32 rounds (2**24 + 1 comes back as 2**24):
    the same int64 as onnx.reference's three nodes."""
    model = _top_level()
    after = applied(model, FuseCountersPass())
    assert op_types(after) == ["CastAdd"]
    feeds = {"x": np.array([x], np.int64)}
    want = run_reference(model, feeds)[0]
    np.testing.assert_array_equal(run_ir(after, feeds)[0], want)
    np.testing.assert_array_equal(run_compiled(model, feeds)[0], want)


@pytest.mark.parametrize(
    "model",
    [_top_level(DOUBLE), _top_level(wide_output=True)],
    ids=["through-double", "float-read-elsewhere"],
)
def test_near_misses_of_the_counter_stay_unfused(model: onnx.ModelProto) -> None:
    """Through float64, or with the float value also an output: not fused."""
    assert "CastAdd" not in op_types(applied(model, FuseCountersPass()))


def _round_trip(source_type: type, as_output: bool) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Cast", ["b"], ["wide"], to=INT64),
        oh.make_node("Cast", ["wide"], ["back"], to=BOOL),
    ]
    if not as_output:
        nodes.append(oh.make_node("Not", ["back"], ["y"]))
    return make_model(
        nodes,
        [tensor_info("b", source_type, [3])],
        [tensor_info("back" if as_output else "y", np.bool_, [3])],
        opsets={"": 17},
    )


def test_a_bool_round_trip_disappears() -> None:
    model = _round_trip(np.bool_, as_output=False)
    after = applied(model, FuseCountersPass())
    assert op_types(after) == ["Not"]
    feeds = {"b": np.array([True, False, True])}
    np.testing.assert_array_equal(run_ir(after, feeds)[0], run_reference(model, feeds)[0])


@pytest.mark.parametrize(
    ("source_type", "as_output"), [(np.int32, False), (np.bool_, True)], ids=["int", "output"]
)
def test_round_trips_that_change_values_or_name_an_output_stay(
    source_type: type, as_output: bool
) -> None:
    """An int32 through int64 to bool is no round trip; a main graph's output keeps its
    node."""
    after = applied(_round_trip(source_type, as_output), FuseCountersPass())
    assert op_types(after).count("Cast") == 2


def _counting_loop() -> onnx.ModelProto:
    """A paddle2onnx-style Loop: ``i + 1`` written twice (once for the condition, once for
    the next counter), the condition ``Less`` handed back through int64."""
    body = oh.make_graph(
        [
            *_plus_one("i_in", "next_a", "a"),
            *_plus_one("i_in", "next_b", "b"),
            oh.make_node("Less", ["next_a", "limit"], ["going"]),
            oh.make_node("Cast", ["going"], ["going_int"], to=INT64),
            oh.make_node("Cast", ["going_int"], ["cond_out"], to=BOOL),
            oh.make_node("Identity", ["next_b"], ["i_out"]),
        ],
        "body",
        [
            tensor_info("iteration", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("i_in", np.int64, [1]),
        ],
        [tensor_info("cond_out", np.bool_, [1]), tensor_info("i_out", np.int64, [1])],
    )
    return make_model(
        [oh.make_node("Loop", ["", "go", "i0"], ["i_last"], body=body)],
        [
            tensor_info("go", np.bool_, []),
            tensor_info("i0", np.int64, [1]),
            tensor_info("limit", np.int64, [1]),
        ],
        [tensor_info("i_last", np.int64, [1])],
        opsets={"": 17},
    )


def test_a_loop_counts_with_one_cast_add_and_no_cast() -> None:
    """In the body both chains become one CastAdd and the round trip goes: no Cast is
    left; the loop stops where onnx.reference's does."""
    model = _counting_loop()
    body = loop_body_op_types(model)
    assert body.count("CastAdd") == 1 and "Cast" not in body
    for limit in (1, 5, 12):
        feeds = {
            "go": np.array(True),
            "i0": np.array([0], np.int64),
            "limit": np.array([limit], np.int64),
        }
        np.testing.assert_array_equal(run_compiled(model, feeds)[0], run_reference(model, feeds)[0])
