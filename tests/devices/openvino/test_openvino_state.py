"""STATEFUL on the OPENVINO device: the variables live inside OpenVINO (its
make-stateful transformation), and behave as on the CPU device.

Every step is compared with the CPU device running the same model with the same
``STATEFUL``: outputs and ``query_state`` values (int64 exactly; float32 with rtol 1e-5,
atol 1e-6), through setting, resetting and a batch change. Atomicity is checked on a
model whose new state is computed by the first node, so that OpenVINO's ``Assign`` has
run when a cancel or a failure stops the step later: the state must stay as it was.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer as ai
from tests.helpers import (
    accumulator_model,
    chain_model,
    kv_cache_model,
    lstm_state_model,
    make_model,
    tensor_info,
)

pytestmark = pytest.mark.anyio

CASES: dict[str, tuple[Callable[[], onnx.ModelProto], object, Callable[[int, int], dict]]] = {
    "accumulator": (
        accumulator_model,
        {"past": "present"},
        lambda step, n: {"x": np.random.default_rng(step).integers(-50, 50, (n, 4))},
    ),
    "lstm": (
        lstm_state_model,
        {"h0": "hn", "c0": "cn"},
        lambda step, n: {
            "X": np.random.default_rng(step).standard_normal((3, n, 4)).astype(np.float32)
        },
    ),
    "kv_cache": (
        kv_cache_model,
        "auto",
        lambda step, n: {
            "x": np.random.default_rng(step).standard_normal((n, 1, 8)).astype(np.float32)
        },
    ),
}


def assert_same(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if actual.dtype.kind == "i":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=what)


def states(request: ai.InferRequest) -> dict[str, np.ndarray]:
    return {s.name: s.state.copy() for s in request.query_state()}


def test_the_variables_are_openvino_s_own() -> None:
    """OpenVINO's compiled model has no state ports: its requests hold the variables."""
    compiled = ai.Core().compile_model(accumulator_model(), "OPENVINO", {"STATEFUL": "auto"})
    engine = compiled.ov_compiled_model
    assert [p.get_any_name() for p in engine.inputs] == ["x"]
    assert [p.get_any_name() for p in engine.outputs] == ["y"]
    assert [s.name for s in engine.create_infer_request().query_state()] == ["pastpresent"]
    assert compiled.get_property("STATEFUL") == {"past": "present"}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_steps_sets_and_resets_agree_with_cpu(case: str) -> None:
    build, stateful, inputs = CASES[case]
    core = ai.Core()
    made = [core.compile_model(build(), d, {"STATEFUL": stateful}) for d in ("OPENVINO", "CPU")]
    requests = [m.create_infer_request() for m in made]

    async def step(index: int, batch: int) -> None:
        feeds = inputs(index, batch)
        got = [await r.infer(feeds) for r in requests]
        for name in got[1]:
            assert_same(got[0][name], got[1][name], f"{case} step {index}: {name}")
        ours, cpu = (states(r) for r in requests)
        assert list(ours) == list(cpu)
        for name in cpu:
            assert_same(ours[name], cpu[name], f"{case} step {index}: state {name}")

    for index in range(3):
        await step(index, 2)
    # A value set from outside, then steps from it.
    for request in requests:
        for state in request.query_state():
            state.state = np.asarray(state.state) + np.ones((), state.state.dtype)
    await step(3, 2)
    # Reset: zeros sized at the next step, here by another batch.
    for request in requests:
        request.reset_state()
    ours, cpu = (states(r) for r in requests)
    for name in cpu:
        assert_same(ours[name], cpu[name], f"{case} after reset: {name}")
    for index in range(4, 6):
        await step(index, 3)
    for model in made:
        await model.close()


async def test_a_state_that_disagrees_with_the_inputs_fails_before_the_step() -> None:
    compiled = ai.Core().compile_model(accumulator_model(), "OPENVINO", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    (state,) = request.query_state()
    state.state = np.full((3, 4), 5, np.int64)
    with pytest.raises(ai.InputShapeError, match=r"variable 'past' dimension 0 \('n'\) is 3"):
        await request.infer({"x": np.ones((2, 4), np.int64)})
    assert state.state.tolist() == [[5] * 4] * 3
    with pytest.raises(ai.InputTypeError, match="outside int32"):
        state.state = np.full((3, 4), 2**40, np.int64)


def early_state_model(steps: int) -> onnx.ModelProto:
    """``state_out = x + state_in`` first, then a chain of ``steps`` MatMul+Tanh pairs and
    a last ``Add(chain, z)`` that fails when ``z``'s batch differs from ``x``'s."""
    model = chain_model(steps, 64)
    graph = model.graph
    graph.node[0].input[0] = "state_out"
    graph.node.insert(0, oh.make_node("Add", ["x", "state_in"], ["state_out"], name="advance"))
    graph.output[0].name = "chain"
    graph.node[-1].output[0] = "chain"
    graph.node.append(oh.make_node("Add", ["chain", "z"], ["y"], name="late"))
    graph.input.extend(
        [tensor_info("state_in", np.float32, ["n", 64]), tensor_info("z", np.float32, ["m", 64])]
    )
    graph.output.extend(
        [tensor_info("y", np.float32, ["n", 64]), tensor_info("state_out", np.float32, ["n", 64])]
    )
    del graph.output[0]
    return model


async def test_a_step_cancelled_after_openvino_assigned_leaves_the_state() -> None:
    compiled = ai.Core().compile_model(
        early_state_model(400), "OPENVINO", {"STATEFUL": {"state_in": "state_out"}}
    )
    request = compiled.create_infer_request()
    feeds = {"x": np.ones((4, 64), np.float32), "z": np.zeros((4, 64), np.float32)}
    durations = []
    for _ in range(3):
        started = anyio.current_time()
        await request.infer(feeds)
        durations.append(anyio.current_time() - started)
    delay, cancelled = min(durations) / 3, 0
    for _ in range(30):
        before = states(request)["state_in"]
        with anyio.move_on_after(delay) as scope:
            await request.infer(feeds)
        after = states(request)["state_in"]
        if scope.cancelled_caught and isinstance(request.error, ai.InferCancelledError):
            cancelled += 1
            np.testing.assert_array_equal(after, before)
        else:  # completed (also when the cancel came once OpenVINO had finished)
            assert request.error is None
            np.testing.assert_array_equal(after, before + 1)
            delay /= 2
        if cancelled == 3:
            break
    assert cancelled > 0, "no cancel landed while OpenVINO computed"


async def test_a_step_failing_after_openvino_assigned_leaves_the_state() -> None:
    compiled = ai.Core().compile_model(
        early_state_model(2), "OPENVINO", {"STATEFUL": {"state_in": "state_out"}}
    )
    request = compiled.create_infer_request()
    x = np.ones((2, 64), np.float32)
    await request.infer({"x": x, "z": np.zeros((2, 64), np.float32)})
    with pytest.raises(ai.InferenceError, match="OpenVINO"):
        await request.infer({"x": x, "z": np.zeros((3, 64), np.float32)})
    np.testing.assert_array_equal(states(request)["state_in"], np.ones((2, 64), np.float32))
    await request.infer({"x": x, "z": np.zeros((2, 64), np.float32)})
    np.testing.assert_array_equal(states(request)["state_in"], np.full((2, 64), 2, np.float32))


async def test_the_state_survives_export_and_import() -> None:
    core = ai.Core()
    build, stateful, inputs = CASES["kv_cache"]
    compiled = core.compile_model(build(), "OPENVINO", {"STATEFUL": stateful})
    imported = core.import_model(compiled.export_model(), "OPENVINO")
    assert imported.get_property("STATEFUL") == {"past_key": "present_key"}
    assert [p.name for p in imported.inputs] == ["x"]
    cpu = core.compile_model(build(), "CPU", {"STATEFUL": stateful}).create_infer_request()
    request = imported.create_infer_request()
    for index in range(3):
        feeds = inputs(index, 2)
        assert_same((await request.infer(feeds))["y"], (await cpu.infer(feeds))["y"], "y")
    assert states(request)["past_key"].shape == (2, 3, 8)


def test_an_unused_state_input_falls_back_to_the_layer_above() -> None:
    """OpenVINO's frontend drops an input no node reads: make-stateful cannot pair it,
    so the variables are kept above the device, and such a model does not export."""
    model = make_model(
        [oh.make_node("Identity", ["x"], ["y"]), oh.make_node("Identity", ["x"], ["state_out"])],
        [tensor_info("x", np.float32, [2]), tensor_info("state_in", np.float32, [2])],
        [tensor_info("y", np.float32, [2]), tensor_info("state_out", np.float32, [2])],
    )
    compiled = ai.Core().compile_model(model, "OPENVINO", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    request.infer_sync({"x": np.array([1, 2], np.float32)})
    assert request.query_state()[0].state.tolist() == [1, 2]
    with pytest.raises(ai.ExportError, match="above the device"):
        compiled.export_model()


async def test_a_failed_step_gives_an_int64_variable_back() -> None:
    # OpenVINO's CPU device hands an int64 variable out as int64 but takes it back only
    # as int32: the value from before the step must go back in the form it takes.
    model = make_model(
        [
            oh.make_node("Add", ["count_in", "step"], ["count_out"], name="advance"),
            oh.make_node("Add", ["x", "z"], ["y"], name="late"),
        ],
        [
            tensor_info("step", np.int64, ["n", 1]),
            tensor_info("count_in", np.int64, ["n", 1]),
            tensor_info("x", np.float32, ["n", 4]),
            tensor_info("z", np.float32, ["m", 4]),
        ],
        [tensor_info("y", np.float32, ["n", 4]), tensor_info("count_out", np.int64, ["n", 1])],
    )
    compiled = ai.Core().compile_model(model, "OPENVINO", {"STATEFUL": {"count_in": "count_out"}})
    request = compiled.create_infer_request()
    feeds = {"step": np.full((2, 1), 3, np.int64), "x": np.ones((2, 4), np.float32)}
    await request.infer({**feeds, "z": np.zeros((2, 4), np.float32)})
    with pytest.raises(ai.InferenceError, match="OpenVINO"):
        await request.infer({**feeds, "z": np.zeros((3, 4), np.float32)})
    assert_same(states(request)["count_in"], np.full((2, 1), 3, np.int64), "after the failure")
    await request.infer({**feeds, "z": np.zeros((2, 4), np.float32)})
    assert_same(states(request)["count_in"], np.full((2, 1), 6, np.int64), "the next step")
