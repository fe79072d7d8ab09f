"""Memory planning: per-request buffers reused by liveness, never aliased by results."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

import aioinfer as ai
from aioinfer.devices.cpu.memory import make_pattern
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
