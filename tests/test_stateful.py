"""Stateful models: make-stateful, variables in the request, atomic steps, the state API.

Numbers are compared with onnxruntime running the model without state, the whole
sequence at once (float32: rtol 1e-4, atol 1e-5 for the decoder, whose steps sum in
another order; 1e-5 / 1e-6 for the LSTM); state bookkeeping is compared exactly.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import aioinfer as ai
from examples.models.decoder import build_decoder
from tests.helpers import make_model, reference_outputs, replace_compute_stage, tensor_info
from tests.test_async import chain_model

pytestmark = pytest.mark.anyio

LAYERS, HEADS, HEAD_DIM = 2, 2, 16
HIDDEN = 8


@pytest.fixture(scope="module")
def decoder() -> onnx.ModelProto:
    return build_decoder(layers=LAYERS, heads=HEADS, d_model=HEADS * HEAD_DIM, seed=3)


@pytest.fixture(scope="module")
def stateful_decoder(decoder: onnx.ModelProto) -> ai.CompiledModel:
    # Every position's logits, as exported: the tests compare them with a full pass.
    return ai.Core().compile_model(decoder, "CPU", {"STATEFUL": "auto", "LOGITS": "ALL"})


def empty_cache(decoder: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    return {
        i.name: np.zeros((batch, HEADS, 0, HEAD_DIM), np.float32)
        for i in decoder.graph.input
        if i.name.startswith("past")
    }


def counter_model(past_shape: list[int | str] | None = None) -> onnx.ModelProto:
    """``present = past + x``, ``y = reshape(present, shape)`` (node ``"reshape_node"``
    fails on a bad ``shape``)."""
    shape = past_shape or ["n"]
    return make_model(
        [
            oh.make_node("Add", ["past", "x"], ["present"], name="add"),
            oh.make_node("Reshape", ["present", "shape"], ["y"], name="reshape_node"),
        ],
        [
            tensor_info("x", np.float32, shape),
            tensor_info("shape", np.int64, [2]),
            tensor_info("past", np.float32, shape),
        ],
        [tensor_info("y", np.float32, [None, None]), tensor_info("present", np.float32, shape)],
    )


def lstm_model() -> onnx.ModelProto:
    """One LSTM layer: X [seq, batch, 4], h0/c0 [1, batch, 8] -> Y, hn, cn."""
    rng = np.random.default_rng(7)
    weights = {
        "W": (rng.standard_normal((1, 4 * HIDDEN, 4)) * 0.5).astype(np.float32),
        "R": (rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.5).astype(np.float32),
        "B": (rng.standard_normal((1, 8 * HIDDEN)) * 0.5).astype(np.float32),
    }
    node = oh.make_node(
        "LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "hn", "cn"], hidden_size=HIDDEN
    )
    state = [1, "batch", HIDDEN]
    return make_model(
        [node],
        [
            tensor_info("X", np.float32, ["seq", "batch", 4]),
            tensor_info("h0", np.float32, state),
            tensor_info("c0", np.float32, state),
        ],
        [
            tensor_info("Y", np.float32, ["seq", 1, "batch", HIDDEN]),
            tensor_info("hn", np.float32, state),
            tensor_info("cn", np.float32, state),
        ],
        weights,
    )


def chain_with_state(steps: int = 10) -> onnx.ModelProto:
    """``state_out = chain(x + state_in)`` over ``steps`` MatMul+Tanh pairs; ``y`` the same."""
    model = chain_model(steps)
    graph = model.graph
    graph.node[0].input[0] = "start"
    graph.node.insert(0, oh.make_node("Add", ["x", "state_in"], ["start"], name="add_state"))
    graph.input.append(oh.make_tensor_value_info("state_in", onnx.TensorProto.FLOAT, ["n", 384]))
    graph.output.append(oh.make_tensor_value_info("state_out", onnx.TensorProto.FLOAT, ["n", 384]))
    graph.node.append(oh.make_node("Identity", [graph.node[-1].input[0]], ["state_out"]))
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def chain() -> ai.CompiledModel:
    return ai.Core().compile_model(chain_with_state(), "CPU", {"STATEFUL": "auto"})


def rows(seed: int, n: int = 4, width: int = 384) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def snapshot(request: ai.InferRequest) -> dict[str, np.ndarray]:
    return {s.name: s.state.copy() for s in request.query_state()}


def assert_same_state(request: ai.InferRequest, expected: dict[str, np.ndarray]) -> None:
    got = snapshot(request)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


# -- a decoder with a KV cache ----------------------------------------------------------------


async def test_single_token_steps_equal_one_full_pass(
    decoder: onnx.ModelProto, stateful_decoder: ai.CompiledModel
) -> None:
    ids = np.random.default_rng(0).integers(1, 20, size=(2, 7)).astype(np.int64)
    want = reference_outputs(decoder, {"input_ids": ids, **empty_cache(decoder, 2)})
    request = stateful_decoder.create_infer_request()
    chunks = [ids[:, :3]] + [ids[:, i : i + 1] for i in range(3, 7)]
    logits = [(await request.infer({"input_ids": chunk}))["logits"] for chunk in chunks]
    np.testing.assert_allclose(np.concatenate(logits, axis=1), want[0], rtol=1e-4, atol=1e-5)
    # The cache in the request is the full pass's present.*.
    presents = dict(zip([o.name for o in decoder.graph.output], want))
    pairs = stateful_decoder.get_property("STATEFUL")
    for state in request.query_state():
        assert state.state.shape == (2, HEADS, 7, HEAD_DIM)
        np.testing.assert_allclose(state.state, presents[pairs[state.name]], rtol=1e-4, atol=1e-5)


async def test_the_kv_cache_starts_empty_with_the_batch_of_input_ids(
    stateful_decoder: ai.CompiledModel,
) -> None:
    request = stateful_decoder.create_infer_request()
    # Nothing known yet: the batch (a symbolic dimension) is 0 like the sequence.
    assert {s.state.shape for s in request.query_state()} == {(0, HEADS, 0, HEAD_DIM)}
    request.set_tensor("input_ids", np.ones((3, 2), np.int64))
    assert {s.state.shape for s in request.query_state()} == {(3, HEADS, 0, HEAD_DIM)}
    await request.infer()
    states = request.query_state()
    assert {s.state.shape for s in states} == {(3, HEADS, 2, HEAD_DIM)}
    assert all(s.state.any() for s in states)
    request.reset_state()
    await request.infer({"input_ids": np.ones((5, 1), np.int64)})
    assert {s.state.shape for s in request.query_state()} == {(5, HEADS, 1, HEAD_DIM)}


async def test_ports_properties_and_ir(
    decoder: onnx.ModelProto, stateful_decoder: ai.CompiledModel
):
    assert [p.name for p in stateful_decoder.inputs] == ["input_ids"]
    assert [p.name for p in stateful_decoder.outputs] == ["logits"]
    assert [(p.index, p.name) for p in stateful_decoder.outputs] == [(0, "logits")]
    expected = {
        f"past_key_values.{i}.{kv}": f"present.{i}.{kv}"
        for i in range(LAYERS)
        for kv in ("key", "value")
    }
    assert stateful_decoder.get_property("STATEFUL") == expected
    assert "STATEFUL" in stateful_decoder.get_property("SUPPORTED_PROPERTIES")
    request = stateful_decoder.create_infer_request()
    assert [s.name for s in request.query_state()] == list(expected)
    state_ops = [n for n in stateful_decoder.graph if n.domain == "ai.aioinfer"]
    reads = {n.attributes["variable_id"].value for n in state_ops if n.op_type == "ReadValue"}
    assigns = {
        (n.attributes["variable_id"].value, n.inputs[0].name)
        for n in state_ops
        if n.op_type == "Assign"
    }
    assert reads == set(expected) and assigns == set(expected.items())
    # The state input is not an input any more.
    with pytest.raises(ai.UnknownInputError, match="its inputs are 'input_ids'"):
        request.set_tensor("past_key_values.0.key", np.zeros((1, 2, 0, 16), np.float32))
    # The Model itself is untouched: compiling without STATEFUL still sees every port.
    plain = ai.Core().compile_model(decoder, "CPU")
    assert len(plain.inputs) == 1 + 2 * LAYERS
    assert plain.get_property("STATEFUL") == {}
    assert plain.create_infer_request().query_state() == []


# -- recurrent operators ------------------------------------------------------------------------


async def test_lstm_fed_in_chunks_equals_the_whole_sequence() -> None:
    model = lstm_model()
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    assert compiled.get_property("STATEFUL") == {"h0": "hn", "c0": "cn"}
    x = np.random.default_rng(1).standard_normal((9, 3, 4)).astype(np.float32)
    zeros = np.zeros((1, 3, HIDDEN), np.float32)
    want_y, want_h, want_c = reference_outputs(model, {"X": x, "h0": zeros, "c0": zeros})
    request = compiled.create_infer_request()
    ys = [(await request.infer({"X": x[a:b]}))["Y"] for a, b in ((0, 4), (4, 5), (5, 9))]
    np.testing.assert_allclose(np.concatenate(ys), want_y, rtol=1e-5, atol=1e-6)
    state = {s.name: s.state for s in request.query_state()}
    np.testing.assert_allclose(state["h0"], want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["c0"], want_c, rtol=1e-5, atol=1e-6)


# -- the state API ----------------------------------------------------------------------------


async def test_reset_restarts_and_a_single_reset_touches_one_variable() -> None:
    compiled = ai.Core().compile_model(lstm_model(), "CPU", {"STATEFUL": {"h0": "hn", "c0": "cn"}})
    x = np.random.default_rng(2).standard_normal((3, 2, 4)).astype(np.float32)
    fresh = await compiled.create_infer_request().infer({"X": x})
    request = compiled.create_infer_request()
    first = await request.infer({"X": x})
    np.testing.assert_array_equal(first["Y"], fresh["Y"])
    second = await request.infer({"X": x})
    assert not np.allclose(second["Y"], fresh["Y"])
    request.reset_state()
    assert all(not s.state.any() for s in request.query_state())
    np.testing.assert_array_equal((await request.infer({"X": x}))["Y"], fresh["Y"])
    h, c = request.query_state()
    c_before = c.state.copy()
    h.reset()
    assert not h.state.any()
    np.testing.assert_array_equal(c.state, c_before)


async def test_two_requests_keep_independent_state() -> None:
    compiled = ai.Core().compile_model(counter_model(), "CPU", {"STATEFUL": "auto"})
    shape = np.array([1, 3], np.int64)
    a, b = compiled.create_infer_request(), compiled.create_infer_request()
    for step in range(1, 4):
        await a.infer({"x": np.full(3, 1.0, np.float32), "shape": shape})
        await b.infer({"x": np.full(3, 10.0, np.float32), "shape": shape})
        np.testing.assert_array_equal(a.query_state()[0].state, np.full(3, step, np.float32))
        np.testing.assert_array_equal(b.query_state()[0].state, np.full(3, 10 * step, np.float32))
    a.reset_state()
    np.testing.assert_array_equal(b.query_state()[0].state, np.full(3, 30, np.float32))


async def test_set_state_is_used_by_the_next_step_and_copied() -> None:
    compiled = ai.Core().compile_model(counter_model(), "CPU", {"STATEFUL": {"past": "present"}})
    request = compiled.create_infer_request()
    (state,) = request.query_state()
    mine = np.array([1, 2, 3, 4], np.float32)
    state.state = mine
    mine[:] = 100  # the request copied it
    results = await request.infer({"x": np.ones(4, np.float32), "shape": [2, 2]})
    np.testing.assert_array_equal(results["y"], [[2, 3], [4, 5]])
    state.state = [0, 0, 1, 1]  # lists are converted like inputs
    results = request.infer_sync({"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(results["y"], [[1, 1], [2, 2]])


async def test_state_and_results_do_not_alias() -> None:
    compiled = ai.Core().compile_model(counter_model(), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    results = await request.infer({"x": np.ones(4, np.float32), "shape": [1, 4]})
    value = request.query_state()[0].state
    with pytest.raises(ValueError, match="read-only"):
        value[0] = 5
    results["y"][:] = 7  # the caller's array: the state does not change
    np.testing.assert_array_equal(request.query_state()[0].state, np.ones(4, np.float32))


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (np.zeros(4, np.float64), ai.InputTypeError, "expected element type float32, got float64"),
        (np.zeros((2, 2), np.float32), ai.InputShapeError, r"expected rank 1 \(shape \[n\]\)"),
        ([1.5, "a"], ai.InputTypeError, "variable 'past'"),
    ],
)
async def test_set_state_rejects_a_wrong_value_and_keeps_the_state(
    value: object, error: type[Exception], message: str
) -> None:
    compiled = ai.Core().compile_model(counter_model(), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    await request.infer({"x": np.ones(4, np.float32), "shape": [1, 4]})
    before = snapshot(request)
    with pytest.raises(error, match=message) as info:
        request.query_state()[0].state = value
    assert "variable 'past'" in str(info.value)
    assert_same_state(request, before)


async def test_set_state_checks_static_dimensions() -> None:
    compiled = ai.Core().compile_model(counter_model([2, 2]), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    assert request.query_state()[0].state.shape == (2, 2)
    with pytest.raises(ai.InputShapeError, match=r"dimension 1 is 3, expected 2"):
        request.query_state()[0].state = np.zeros((2, 3), np.float32)


async def test_a_produced_state_of_the_wrong_shape_is_not_committed() -> None:
    # The output grows while the input's declared shape is static: the first step's new
    # value cannot be held by the variable.
    model = make_model(
        [
            oh.make_node("Concat", ["past", "x"], ["present"], axis=0),
            oh.make_node("ReduceSum", ["present"], ["y"], keepdims=0),
        ],
        [tensor_info("x", np.float32, [1]), tensor_info("past", np.float32, [2])],
        [tensor_info("y", np.float32, []), tensor_info("present", np.float32, [3])],
    )
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    with pytest.raises(
        ai.InferenceError, match=r"output 'present'.*variable 'past'.*dimension 0 is 3"
    ):
        await request.infer({"x": np.ones(1, np.float32)})
    np.testing.assert_array_equal(request.query_state()[0].state, np.zeros(2, np.float32))


# -- atomic steps ---------------------------------------------------------------------------------


def hold_mid_plan(request: ai.InferRequest) -> tuple[threading.Event, list[type | None]]:
    """Make the middle kernel of ``request``'s plan wait, on its first run, until the
    request is cancelled. Call it before the request's first inference (later runs with
    the same shapes use the kernels its memory plan bound).

    Returns an event set when that kernel is reached (the kernels before it ran) and a
    list that records how the plan ended (None: completed, else the exception type).
    """
    inner = request._request
    plan = inner._plan
    middle = len(plan.steps) // 2
    reached, outcome = threading.Event(), []
    step = plan.steps[middle]

    def held(*inputs: object) -> object:
        if not reached.is_set():  # hold the first run only
            reached.set()
            deadline = time.monotonic() + 60  # a hang guard
            while not inner.cancel_token.requested:
                if time.monotonic() > deadline:
                    raise TimeoutError("the held step was never cancelled")
                time.sleep(0.001)
        return step.kernel(*inputs)

    steps = (
        *plan.steps[:middle],
        dataclasses.replace(step, kernel=held),
        *plan.steps[middle + 1 :],
    )
    inner._plan = dataclasses.replace(plan, steps=steps)
    original = inner.start_pipeline

    def start_pipeline() -> None:
        try:
            original()
        except BaseException as exc:
            outcome.append(type(exc))
            raise
        outcome.append(None)

    # The held kernel blocks until cancelled: on a thread, never inline on the loop
    # (runs of these shapes on other requests may have been short enough for it).
    replace_compute_stage(request, start_pipeline, threaded=True)
    return reached, outcome


async def reached_(event: threading.Event) -> None:
    with anyio.fail_after(60):
        while not event.is_set():
            await anyio.sleep(0.001)


@pytest.mark.parametrize("how", ["cancel()", "task cancellation"])
async def test_a_step_cancelled_mid_plan_leaves_every_variable_as_it_was(
    chain: ai.CompiledModel, how: str
) -> None:
    request = chain.create_infer_request()
    reached, outcome = hold_mid_plan(request)
    request.query_state()[0].state = rows(1)
    before = snapshot(request)
    if how == "cancel()":
        request.start_async({"x": rows(2)})
        await reached_(reached)
        request.cancel()
        with pytest.raises(ai.InferCancelledError):
            await request.wait()
    else:
        async with anyio.create_task_group() as tg:
            tg.start_soon(request.infer, {"x": rows(2)})
            await reached_(reached)
            tg.cancel_scope.cancel()
    assert outcome == [ai.InferCancelledError]  # the plan was stopped half-way
    assert_same_state(request, before)
    # The next step continues from the state before the cancelled one.
    results = await request.infer({"x": rows(3)})
    replay = chain.create_infer_request()
    replay.query_state()[0].state = rows(1)
    np.testing.assert_array_equal(results["y"], (await replay.infer({"x": rows(3)}))["y"])


async def test_a_step_cancelled_after_its_plan_completed_commits_nothing(
    chain: ai.CompiledModel,
) -> None:
    request = chain.create_infer_request()
    await request.infer({"x": rows(1)})
    before = snapshot(request)
    inner = request._request
    original = inner.start_pipeline

    def compute_then_cancel() -> None:
        original()
        inner.cancel()  # arrives after the last kernel, before the results are published

    replace_compute_stage(request, compute_then_cancel)
    with pytest.raises(ai.InferCancelledError):
        await request.infer({"x": rows(2)})
    assert_same_state(request, before)


async def test_a_failed_step_leaves_every_variable_as_it_was() -> None:
    compiled = ai.Core().compile_model(counter_model(), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    await request.infer({"x": np.ones(6, np.float32), "shape": [2, 3]})
    before = snapshot(request)
    with pytest.raises(ai.InferenceError, match="reshape_node"):
        await request.infer({"x": np.ones(6, np.float32), "shape": [4, 4]})
    assert_same_state(request, before)
    results = await request.infer({"x": np.ones(6, np.float32), "shape": [3, 2]})
    np.testing.assert_array_equal(results["y"], np.full((3, 2), 2, np.float32))


async def test_state_calls_while_busy_raise_and_reads_see_the_last_step(
    chain: ai.CompiledModel,
) -> None:
    request = chain.create_infer_request()
    reached, _ = hold_mid_plan(request)
    (state,) = request.query_state()
    state.state = rows(1)
    before = state.state.copy()
    request.start_async({"x": rows(2)})
    await reached_(reached)
    calls: list[Callable[[], object]] = [
        request.query_state,
        request.reset_state,
        state.reset,
        lambda: setattr(state, "state", before),
    ]
    for call in calls:
        with pytest.raises(ai.RequestBusyError, match="already running"):
            call()
    np.testing.assert_array_equal(state.state, before)
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    await request.close()
    with pytest.raises(ai.RequestClosedError):
        request.query_state()


# -- configuration ------------------------------------------------------------------------------


def pair_model(input_name: str, output_name: str) -> onnx.ModelProto:
    return make_model(
        [
            oh.make_node("Add", ["x", input_name], [output_name]),
            oh.make_node("Neg", [output_name], ["y"]),
        ],
        [tensor_info("x", np.float32, [2]), tensor_info(input_name, np.float32, [2])],
        [tensor_info("y", np.float32, [2]), tensor_info(output_name, np.float32, [2])],
    )


@pytest.mark.parametrize(
    ("input_name", "output_name"),
    [
        ("past_key_values.3.key", "present.3.key"),
        ("past_key_values.0.value", "present_key_values.0.value"),
        ("past_7", "present_7"),
        ("past", "present"),
        ("h0", "hn"),
        ("lstm.c0", "lstm.cn"),
        ("state_in", "state_out"),
        ("rnn_state_in_1", "rnn_state_out_1"),
        ("state", "stateN"),
        ("h", "hn"),
        ("c", "cn"),
        ("lstm_h", "lstm_hn"),
        ("h_in", "h_out"),
        ("cache_in", "cache_out"),
        ("state", "state_out"),
        ("hidden", "hidden_out"),
        ("cached_len_0", "new_cached_len_0"),
        ("state", "new_state"),
    ],
)
def test_auto_pairs_exporter_conventions(input_name: str, output_name: str) -> None:
    compiled = ai.Core().compile_model(
        pair_model(input_name, output_name), "CPU", {"STATEFUL": "AUTO"}
    )
    assert compiled.get_property("STATEFUL") == {input_name: output_name}
    assert [p.name for p in compiled.inputs] == ["x"]
    assert [p.name for p in compiled.outputs] == ["y"]


def model_with(past: tuple[type, list[int]], present: tuple[type, list[int]]) -> onnx.ModelProto:
    return make_model(
        [oh.make_node("Identity", ["x"], ["present"]), oh.make_node("Identity", ["past"], ["y"])],
        [tensor_info("x", present[0], present[1]), tensor_info("past", past[0], past[1])],
        [tensor_info("y", past[0], past[1]), tensor_info("present", present[0], present[1])],
    )


@pytest.mark.parametrize(
    ("model", "config", "message"),
    [
        (
            counter_model(),
            {"pst": "present"},
            r"pair 'pst' -> 'present': the model has no input named 'pst'; "
            r"its inputs are 'x', 'shape', 'past'",
        ),
        (
            counter_model(),
            {"past": "presnt"},
            r"no output named 'presnt'; its outputs are 'y', 'present'",
        ),
        (
            counter_model(),
            {"x": "y"},
            r"pair 'x' -> 'y': the ranks differ \(input rank 1, output rank 2\)",
        ),
        (
            model_with((np.float32, [2]), (np.float64, [2])),
            {"past": "present"},
            r"pair 'past' -> 'present': the element types differ \(input float, output double\)",
        ),
        (
            pair_model("a", "b"),
            "auto",
            "no input/output pair of the model follows a known convention",
        ),
        (counter_model(), 42, "expected 'auto' or a mapping"),
        (counter_model(), "sometimes", "expected 'auto' or a mapping"),
        (counter_model(), {"past": 3}, "names must be strings"),
        (
            counter_model(),
            {"past": "present", "x": "present"},
            "'present' is paired with two inputs",
        ),
    ],
)
def test_bad_stateful_configs_fail_clearly(
    model: onnx.ModelProto, config: object, message: str
) -> None:
    core = ai.Core()
    with pytest.raises(ai.InvalidPropertyValueError, match=message):
        core.compile_model(model, "CPU", {"STATEFUL": config})
    # The core (and the model) stay usable.
    assert core.compile_model(model, "CPU").create_infer_request() is not None


def test_a_state_input_needs_a_known_rank() -> None:
    # ONNX's checker wants shapes on graph inputs; an onnx_ir model may lack them.
    graph = oh.make_graph(
        [oh.make_node("Identity", ["past"], ["present"])],
        "no_rank",
        [oh.make_tensor_value_info("past", onnx.TensorProto.FLOAT, None)],
        [oh.make_tensor_value_info("present", onnx.TensorProto.FLOAT, None)],
    )
    model = ir.serde.deserialize_model(oh.make_model(graph))
    with pytest.raises(ai.InvalidPropertyValueError, match="the input has no known rank"):
        ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})


async def test_export_and_import_keep_the_pairs() -> None:
    core = ai.Core()
    compiled = core.compile_model(counter_model(), "CPU", {"STATEFUL": "auto"})
    imported = core.import_model(compiled.export_model(), "CPU")
    assert imported.get_property("STATEFUL") == {"past": "present"}
    assert [p.name for p in imported.inputs] == ["x", "shape"]
    assert [p.name for p in imported.outputs] == ["y"]
    request = imported.create_infer_request()
    for step in (1, 2):
        results = await request.infer({"x": np.ones(4, np.float32), "shape": [2, 2]})
        np.testing.assert_array_equal(results["y"], np.full((2, 2), step, np.float32))
    assert [s.name for s in request.query_state()] == ["past"]
