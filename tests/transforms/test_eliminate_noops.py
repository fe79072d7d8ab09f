"""EliminateNoOpsPass: nodes that hand their input back unchanged go."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.transforms.eliminate_noops import EliminateNoOpsPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(12)
WEIGHTS = {
    "axes": np.array([0], np.int64),
    "zero": np.array([0.0], np.float32),
    "one": np.array(1.0, np.float32),
    "wide_zero": np.zeros((1, 1, 1), np.float32),
    "negative_axes": np.array([-1], np.int64),
    "two": np.array([2.0], np.float32),
}


def _model(nodes: list, output_shape: list[int] | None = None) -> object:
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [3, 4])],
        [tensor_info("y", np.float32, output_shape or [3, 4])],
        WEIGHTS,
    )


def _check(model: object, expected_ops: list[str]) -> None:
    """The ops left after the pass, and values equal to onnx.reference (exactly)."""
    after = applied(model, EliminateNoOpsPass())  # type: ignore[arg-type]
    assert op_types(after) == expected_ops
    feeds = {"x": RNG.standard_normal((3, 4)).astype(np.float32)}
    want = run_reference(model, feeds)  # type: ignore[arg-type]
    assert_close(run_ir(after, feeds), want, rtol=0, atol=0)
    assert_close(run_compiled(model, feeds), want, rtol=0, atol=0)  # type: ignore[arg-type]


def test_paddle_assign_unsqueeze_add_zero_squeeze_goes() -> None:
    nodes = [
        oh.make_node("Unsqueeze", ["x", "axes"], ["u"]),
        oh.make_node("Add", ["u", "zero"], ["a"]),
        oh.make_node("Squeeze", ["a", "axes"], ["s"]),
        oh.make_node("Mul", ["one", "s"], ["m"]),
        oh.make_node("Div", ["m", "one"], ["d"]),
        oh.make_node("Sub", ["d", "zero"], ["i0"]),
        oh.make_node("Identity", ["i0"], ["i1"]),
        oh.make_node("Relu", ["i1"], ["y"]),
    ]
    _check(_model(nodes), ["Relu"])


def test_squeeze_then_unsqueeze_of_the_same_axes_goes() -> None:
    nodes = [
        oh.make_node("Unsqueeze", ["x", "axes"], ["u"]),
        oh.make_node("Relu", ["u"], ["r"]),
        oh.make_node("Squeeze", ["r", "axes"], ["s"]),
        oh.make_node("Unsqueeze", ["s", "axes"], ["t"]),
        oh.make_node("Squeeze", ["t", "axes"], ["y"]),
    ]
    # The last Squeeze makes the output: it stays (its name is the model's output).
    _check(_model(nodes), ["Unsqueeze", "Relu", "Squeeze"])


@pytest.mark.parametrize(
    ("nodes", "shape"),
    [
        # a zero of higher rank broadcasts x up: not a no-op
        (
            [oh.make_node("Add", ["x", "wide_zero"], ["a"]), oh.make_node("Relu", ["a"], ["y"])],
            [1, 3, 4],
        ),
        # zero minus x is no no-op
        ([oh.make_node("Sub", ["zero", "x"], ["a"]), oh.make_node("Relu", ["a"], ["y"])], None),
        # another constant
        ([oh.make_node("Mul", ["x", "two"], ["a"]), oh.make_node("Relu", ["a"], ["y"])], None),
        # negative axes may mean different axes before and after
        (
            [
                oh.make_node("Unsqueeze", ["x", "negative_axes"], ["u"]),
                oh.make_node("Squeeze", ["u", "negative_axes"], ["a"]),
                oh.make_node("Relu", ["a"], ["y"]),
            ],
            None,
        ),
    ],
)
def test_what_changes_its_input_stays(nodes: list, shape: list[int] | None) -> None:
    model = _model(nodes, shape)
    _check(model, op_types(model))  # type: ignore[arg-type]


def test_a_no_op_making_the_model_output_keeps_its_name() -> None:
    nodes = [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Add", ["r", "zero"], ["y"])]
    _check(_model(nodes), ["Relu", "Add"])


def test_a_branch_returning_an_outer_value_through_identity_compiles() -> None:
    """A subgraph's output cannot be a value of the enclosing graph: the Identity that
    makes it one stays."""
    then_branch = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["t"])], "then", [], [tensor_info("t", np.float32, [3, 4])]
    )
    else_branch = oh.make_graph(
        [oh.make_node("Neg", ["x"], ["e"])], "else", [], [tensor_info("e", np.float32, [3, 4])]
    )
    model = make_model(
        [oh.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        [tensor_info("flag", np.bool_, []), tensor_info("x", np.float32, [3, 4])],
        [tensor_info("y", np.float32, [3, 4])],
    )
    compiled = ai.Core().compile_model(model, "CPU")
    node = next(n for n in compiled.graph if n.op_type == "If")
    assert [n.op_type for n in node.attributes["then_branch"].as_graph()] == ["Identity"]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for flag in (True, False):
        feeds = {"flag": np.array(flag), "x": x}
        assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=0, atol=0)
