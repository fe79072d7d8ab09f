"""Memory planning: per-request buffers reused by liveness, never aliased by results."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.devices.cpu.memory import _joined, make_pattern
from aioinfer.plugin.sync_request import CancelToken
from tests.helpers import make_model, tensor_info
from tests.transforms._util import run_reference

RNG = np.random.default_rng(9)
WIDTH = 64


def _chain(layers: int = 6) -> object:
    """``layers`` MatMul + Relu layers: each hidden value dies when the next is made."""
    nodes, weights, last = [], {}, "x"
    for i in range(layers):
        weights[f"w{i}"] = (RNG.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32)
        nodes.append(oh.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]))
        last = f"h{i}" if i < layers - 1 else "y"
        nodes.append(oh.make_node("Relu", [f"m{i}"], [last]))
    return make_model(
        nodes,
        [tensor_info("x", np.float32, ["n", WIDTH])],
        [tensor_info("y", np.float32, ["n", WIDTH])],
        weights,
    )


def test_buffers_are_reused_and_reported() -> None:
    compiled = ai.Core().compile_model(_chain(), "CPU")
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == 0
    request = compiled.create_infer_request()
    x = RNG.standard_normal((16, WIDTH)).astype(np.float32)
    request.infer_sync({"x": x})
    one_hidden = 16 * WIDTH * 4
    # Five hidden values, alive two at a time: two buffers.
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == 2 * one_hidden


def test_planned_runs_match_the_reference_and_results_are_owned() -> None:
    model = _chain()
    compiled = ai.Core().compile_model(model, "CPU")
    request = compiled.create_infer_request()
    kept = []
    for rows in (16, 16, 16, 4, 4):  # new shapes make a new plan
        x = RNG.standard_normal((rows, WIDTH)).astype(np.float32)
        y = request.infer_sync({"x": x})["y"]
        np.testing.assert_allclose(y, run_reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
        kept.append((y, y.copy()))
    for y, copy in kept:  # later inferences never wrote into earlier results
        np.testing.assert_array_equal(y, copy)
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == 2 * 4 * WIDTH * 4


def test_a_view_of_a_planned_value_keeps_its_buffer() -> None:
    """h1 is reshaped (a view) and read after h2 was computed: without alias analysis h2
    would overwrite h1's buffer."""
    weights = {
        "w1": RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32),
        "w2": RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32),
        "flat": np.array([-1], np.int64),
        "back": np.array([-1, WIDTH], np.int64),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["m1"]),
        oh.make_node("Relu", ["m1"], ["h1"]),
        oh.make_node("Reshape", ["h1", "flat"], ["v"]),
        oh.make_node("MatMul", ["x", "w2"], ["m2"]),
        oh.make_node("Sigmoid", ["m2"], ["h2"]),
        oh.make_node("MatMul", ["h2", "w1"], ["m3"]),
        oh.make_node("Tanh", ["m3"], ["h3"]),
        oh.make_node("Reshape", ["v", "back"], ["u"]),
        oh.make_node("Add", ["u", "h3"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [8, WIDTH])],
        [tensor_info("y", np.float32, [8, WIDTH])],
        weights,
    )
    request = ai.Core().compile_model(model, "CPU").create_infer_request()
    for _ in range(3):
        x = RNG.standard_normal((8, WIDTH)).astype(np.float32)
        y = request.infer_sync({"x": x})["y"]
        np.testing.assert_allclose(y, run_reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_outputs_are_never_views_of_buffers() -> None:
    weights = {"w": np.eye(WIDTH, dtype=np.float32), "shape": np.array([-1], np.int64)}
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["m"]),
        oh.make_node("Relu", ["m"], ["h"]),
        oh.make_node("Reshape", ["h", "shape"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [2, WIDTH])],
        [tensor_info("y", np.float32, [2 * WIDTH])],
        weights,
    )
    request = ai.Core().compile_model(model, "CPU").create_infer_request()
    first = request.infer_sync({"x": np.ones((2, WIDTH), np.float32)})["y"]
    second = request.infer_sync({"x": np.full((2, WIDTH), 2, np.float32)})["y"]
    assert first.flags.owndata and second.flags.owndata
    assert (first == 1).all() and (second == 2).all()


def test_make_pattern_shares_buffers_of_disjoint_lifetimes() -> None:
    compiled = ai.Core().compile_model(_chain(4), "CPU")
    plan = compiled.plan  # type: ignore[attr-defined]
    produced = [np.empty((10, WIDTH), np.float32) for _ in plan.steps]
    pattern = make_pattern(plan, produced)
    # Four steps: the last writes the graph output (not planned); three hidden values.
    assert len(pattern.assignments) == 3
    assert len(pattern.sizes) == 2
    assert pattern.nbytes == 2 * 10 * WIDTH * 4


def test_planned_convolutions_and_attention_match_onnxruntime() -> None:
    """Fused convolutions (with residuals) and the BERT block run from planned buffers."""
    from benchmarks import models
    from tests.helpers import reference_outputs

    cases = [
        (models.cnn(size=16, channels=(4, 8)), lambda: {"x": RNG.standard_normal((2, 3, 16, 16))}),
        (
            models.bert(layers=1, hidden=32, heads=4, intermediate=64),
            lambda: {
                "hidden_states": RNG.standard_normal((2, 8, 32)),
                "attention_mask": np.array([[1] * 8, [1] * 5 + [0] * 3]),
            },
        ),
    ]
    for model, make_feeds in cases:
        compiled = ai.Core().compile_model(model, "CPU")
        request = compiled.create_infer_request()
        for _ in range(3):
            feeds = {
                k: v.astype(np.float32 if v.dtype.kind == "f" else np.int64)
                for k, v in make_feeds().items()
            }
            got = request.infer_sync(feeds)[0]
            np.testing.assert_allclose(
                got, reference_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4
            )
        assert compiled.get_property("ACTIVATION_MEMORY_BYTES") > 0


def _fire(batch: int, shared: bool = False, concat_is_output: bool = False) -> object:
    """A SqueezeNet fire module: squeeze (1x1 conv, Relu), two expand branches (1x1 and
    padded 3x3 conv, Relu) concatenated along the channels, then a 1x1 conv. ``shared``:
    a second reader of one branch; ``concat_is_output``: the Concat is the graph output."""
    weights = {
        "ws": (RNG.standard_normal((4, 6, 1, 1)) / 2).astype(np.float32),
        "bs": RNG.standard_normal(4).astype(np.float32),
        "w1": (RNG.standard_normal((5, 4, 1, 1)) / 2).astype(np.float32),
        "b1": RNG.standard_normal(5).astype(np.float32),
        "w3": (RNG.standard_normal((7, 4, 3, 3)) / 4).astype(np.float32),
        "b3": RNG.standard_normal(7).astype(np.float32),
        "wo": (RNG.standard_normal((3, 12, 1, 1)) / 4).astype(np.float32),
    }
    nodes = [
        oh.make_node("Conv", ["x", "ws", "bs"], ["s0"]),
        oh.make_node("Relu", ["s0"], ["s"]),
        oh.make_node("Conv", ["s", "w1", "b1"], ["e10"]),
        oh.make_node("Relu", ["e10"], ["e1"]),
        oh.make_node("Conv", ["s", "w3", "b3"], ["e30"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["e30"], ["e3"]),
        oh.make_node("Concat", ["e1", "e3"], ["cat"], axis=1),
    ]
    outputs = [tensor_info("y", np.float32, [batch, 3, 9, 8])]
    if concat_is_output:
        outputs = [tensor_info("cat", np.float32, [batch, 12, 9, 8])]
    else:
        nodes.append(oh.make_node("Conv", ["cat", "wo"], ["y"]))
    if shared:
        nodes.append(oh.make_node("Sigmoid", ["e3"], ["side"]))
        outputs.append(tensor_info("side", np.float32, [batch, 7, 9, 8]))
    return make_model(nodes, [tensor_info("x", np.float32, [batch, 6, 9, 8])], outputs, weights)


def _joins(compiled: object, x: np.ndarray) -> int:
    """How many Concat steps the memory plan of ``compiled``'s plan on ``x`` joins."""
    plan = compiled.plan  # type: ignore[attr-defined]
    produced: list[object] = []
    plan.run([x], CancelToken(), lambda step, outputs, seconds: produced.append(outputs[0]))
    return len(make_pattern(plan, produced).joins)


@pytest.mark.parametrize(
    ("batch", "shared", "concat_is_output", "joined"),
    [
        (1, False, False, 1),  # the branches write into their parts of the Concat
        (2, False, False, 0),  # parts along axis 1 of a batch of 2 are not contiguous
        (1, True, False, 0),  # a branch read by another node keeps its own buffer
        (1, False, True, 0),  # graph outputs are never planned
    ],
)
def test_concat_of_planned_branches_is_joined(
    batch: int, shared: bool, concat_is_output: bool, joined: int
) -> None:
    """A Concat whose inputs come from planned convolutions read by nothing else gets
    its inputs written into its own buffer; every variant matches onnx.reference over
    several inferences of one request (the planned runs)."""
    model = _fire(batch, shared, concat_is_output)
    compiled = ai.Core().compile_model(model, "CPU")
    request = compiled.create_infer_request()
    for _ in range(3):
        x = RNG.standard_normal((batch, 6, 9, 8)).astype(np.float32)
        got = request.infer_sync({"x": x})
        for g, w in zip(got.to_tuple(), run_reference(model, {"x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert _joins(compiled, x) == joined


def test_a_joined_concat_copies_what_its_producers_did_not_write() -> None:
    """A producer that returned an array of its own (its out form may) is copied into
    its part; inputs of other shapes than planned make a plain Concat."""
    out = np.zeros((1, 5, 2), np.float32)
    parts = (out[:, :2], out[:, 2:])
    run = _joined(out, parts, lambda *xs: (np.concatenate(xs, axis=1),))
    a, b = np.ones((1, 2, 2), np.float32), np.full((1, 3, 2), 2, np.float32)
    (y,) = run(a, b)
    assert y is out
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    parts[0][...] = 7  # written in place by its producer: kept
    (y,) = run(parts[0], b)
    np.testing.assert_array_equal(y[:, :2], 7)
    wide = np.ones((1, 4, 2), np.float32)
    (y,) = run(wide, b)
    assert y is not out and y.shape == (1, 7, 2)
    np.testing.assert_array_equal(y, np.concatenate([wide, b], axis=1))
