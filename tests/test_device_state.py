"""Variable state on every device: CPU keeps its variables natively; TWOSTAGE (the example
third-party device) and PROCESS:CPU get them from the layer above the device
(:mod:`aioinfer.plugin.stateful`).

Each device runs the same stateful models, and every step is compared with a hand loop
that feeds the state explicitly to onnxruntime running the model without state: an
accumulator (int64: exact), an LSTM with ``h``/``c`` pairs whose batch dimension the model
leaves unnamed (float32: rtol 1e-5, atol 1e-6), a KV-cache-like concat with attention
over the cache (float32: rtol 1e-5, atol 1e-6) and a voice-activity detector with silero
VAD's signature, whose state ``[2, ?, 128]`` is sized by the batch of ``input [?, samples]``
(float32: rtol 1e-5, atol 1e-6). State bookkeeping is compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
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

DEVICES = ("CPU", "TWOSTAGE", "PROCESS:CPU", "ORT", "PROCESS:ORT", "OPENVINO")
BATCH, STEPS = 2, 5


@dataclass(frozen=True)
class Case:
    """A stateful model, its pairs, and how the hand loop starts and feeds it."""

    build: Callable[[], onnx.ModelProto]
    stateful: str | dict[str, str]
    pairs: dict[str, str]
    """The pairs ``STATEFUL`` makes."""
    inputs: Callable[[int], dict[str, np.ndarray]]
    """The regular inputs of step ``i``."""
    initial: dict[str, np.ndarray]
    """The state before the first step (zeros, sized by the rules of docs/stateful.md)."""
    exact: bool = False


def _rng(step: int) -> np.random.Generator:
    return np.random.default_rng(100 + step)


def vad_model(state: list[int | str | None] | None = None, second: bool = False) -> onnx.ModelProto:
    """silero VAD's signature: ``input`` float32 ``[?, samples]``, ``state`` float32
    ``[2, ?, 128]`` (or ``state``), ``sr`` int64 scalar; ``stateN [?, ?, ?]`` is
    ``state / 2`` plus each row's mean input, ``output [?, 1]`` the new state's mean per
    row. No node tells the state's batch. With ``second``, an input ``extra [?, 4]``
    whose leading dimension is not ``input``'s (added to the output)."""
    node = oh.make_node
    nodes = [
        node("ReduceMean", ["input", "axis1"], ["level"], keepdims=1),  # [b, 1]
        node("Unsqueeze", ["level", "axis0"], ["level3"]),  # [1, b, 1]
        node("Mul", ["state", "half"], ["decayed"]),
        node("Add", ["decayed", "level3"], ["stateN"]),
        node("ReduceMean", ["stateN", "axes02"], ["mean"], keepdims=0),  # [b]
        node("Cast", ["sr"], ["rate"], to=onnx.TensorProto.FLOAT),
        node("Div", ["rate", "rate"], ["one"]),
        node("Mul", ["mean", "one"], ["scaled"]),
        node("Unsqueeze", ["scaled", "axis1"], ["output"]),  # [b, 1]
    ]
    inputs = [
        tensor_info("input", np.float32, [None, "samples"]),
        tensor_info("state", np.float32, state or [2, None, 128]),
        tensor_info("sr", np.int64, []),
    ]
    if second:
        nodes[-1] = node("Unsqueeze", ["scaled", "axis1"], ["plain"])
        nodes += [
            node("ReduceMean", ["extra", "axis1"], ["extra_mean"], keepdims=1),
            node("Add", ["plain", "extra_mean"], ["output"]),
        ]
        inputs.append(tensor_info("extra", np.float32, [None, 4]))
    constants = {
        "axis0": np.array([0], np.int64),
        "axis1": np.array([1], np.int64),
        "axes02": np.array([0, 2], np.int64),
        "half": np.array(0.5, np.float32),
    }
    return make_model(
        nodes,
        inputs,
        [
            tensor_info("output", np.float32, [None, 1]),
            tensor_info("stateN", np.float32, [None, None, None]),
        ],
        constants,
        name="vad",
    )


CASES = {
    "accumulator": Case(
        accumulator_model,
        {"past": "present"},
        {"past": "present"},
        lambda i: {"x": _rng(i).integers(-50, 50, (BATCH, 4)).astype(np.int64)},
        {"past": np.zeros((BATCH, 4), np.int64)},
        exact=True,
    ),
    "lstm": Case(
        lstm_state_model,
        {"h0": "hn", "c0": "cn"},
        {"h0": "hn", "c0": "cn"},
        lambda i: {"X": _rng(i).standard_normal((3, BATCH, 4)).astype(np.float32)},
        {name: np.zeros((1, BATCH, 8), np.float32) for name in ("h0", "c0")},
    ),
    "kv_cache": Case(
        kv_cache_model,
        "auto",
        {"past_key": "present_key"},
        lambda i: {"x": _rng(i).standard_normal((BATCH, 1, 8)).astype(np.float32)},
        {"past_key": np.zeros((BATCH, 0, 8), np.float32)},
    ),
    "vad": Case(
        vad_model,
        "auto",
        {"state": "stateN"},
        lambda i: {
            "input": _rng(i).standard_normal((BATCH, 512)).astype(np.float32),
            "sr": np.array(16000, np.int64),
        },
        {"state": np.zeros((2, BATCH, 128), np.float32)},
    ),
}


@pytest.fixture(scope="module")
def compiled() -> Iterator[Callable[[str, str], ai.CompiledModel]]:
    """``compiled(device, case)``: the case's model compiled with ``STATEFUL`` on the
    device, once per module (a PROCESS worker takes a second to start)."""
    core = ai.Core()
    made: dict[tuple[str, str], ai.CompiledModel] = {}

    def get(device: str, case: str) -> ai.CompiledModel:
        if (device, case) not in made:
            config = {"STATEFUL": CASES[case].stateful}
            made[device, case] = core.compile_model(CASES[case].build(), device, config)
        return made[device, case]

    yield get

    async def close_all() -> None:
        for model in made.values():
            await model.close()

    anyio.run(close_all)


def hand_loop(case: Case, steps: int) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(outputs, state after the step) of each step, from onnxruntime fed the state."""
    model = case.build()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    state = dict(case.initial)
    expected = []
    for step in range(steps):
        produced = dict(zip(names, session.run(None, {**case.inputs(step), **state})))
        state = {name: produced[output] for name, output in case.pairs.items()}
        outputs = {n: v for n, v in produced.items() if n not in case.pairs.values()}
        expected.append((outputs, state))
    return expected


def assert_close(actual: np.ndarray, expected: np.ndarray, case: Case, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if case.exact:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=what)


def state_of(request: ai.InferRequest) -> dict[str, np.ndarray]:
    return {s.name: s.state.copy() for s in request.query_state()}


# -- the same steps as a hand loop ------------------------------------------------------------


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
async def test_steps_equal_a_hand_loop_feeding_the_state(compiled, device, case_name) -> None:
    case = CASES[case_name]
    model = compiled(device, case_name)
    request = model.create_infer_request()
    # The initial state follows the rules: sized by the inputs set (the LSTM's unnamed
    # batch by X's, the cache empty).
    request.set_tensor(*next(iter(case.inputs(0).items())))
    for name, value in state_of(request).items():
        assert_close(value, case.initial[name], case, f"{device}: initial {name}")
    for step, (outputs, state) in enumerate(hand_loop(case, STEPS)):
        results = await request.infer(case.inputs(step))
        assert list(results) == list(outputs), device
        for name, value in outputs.items():
            assert_close(results[name], value, case, f"{device} step {step}: {name}")
        got = state_of(request)
        assert list(got) == list(case.pairs)
        for name, value in state.items():
            assert_close(got[name], value, case, f"{device} step {step}: state {name}")


@pytest.mark.parametrize("device", DEVICES)
async def test_the_sync_path_keeps_state_too(compiled, device) -> None:
    case = CASES["lstm"]
    request = compiled(device, "lstm").create_infer_request()
    expected = hand_loop(case, 3)
    for step, (outputs, _) in enumerate(expected):
        results = request.infer_sync(case.inputs(step))
        assert_close(results["Y"], outputs["Y"], case, f"{device} step {step}")
    for name, value in expected[-1][1].items():
        assert_close(state_of(request)[name], value, case, f"{device}: {name}")


@pytest.mark.parametrize("device", DEVICES)
async def test_the_state_ports_are_hidden_and_the_pairs_read_back(compiled, device) -> None:
    model = compiled(device, "kv_cache")
    assert [p.name for p in model.inputs] == ["x"]
    assert [p.name for p in model.outputs] == ["y"]
    assert [p.index for p in model.inputs + model.outputs] == [0, 0]
    assert model.get_property("STATEFUL") == {"past_key": "present_key"}
    assert "STATEFUL" in model.get_property("SUPPORTED_PROPERTIES")
    request = model.create_infer_request()
    with pytest.raises(ai.UnknownInputError, match="past_key"):
        await request.infer({"x": np.zeros((1, 1, 8), np.float32), "past_key": np.zeros(1)})
    results = await request.infer({"x": np.zeros((1, 1, 8), np.float32)})
    assert list(results) == ["y"]
    with pytest.raises(ai.UnknownInputError, match="present_key"):
        request.get_tensor("present_key")


# -- the state API ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
async def test_set_reset_and_read_state(compiled, device) -> None:
    request = compiled(device, "accumulator").create_infer_request()
    x = np.ones((BATCH, 4), np.int64)
    (state,) = request.query_state()
    assert state.name == "past"
    state.state = np.full((BATCH, 4), 10, np.int64)
    assert (await request.infer({"x": x}))["y"].tolist() == [[11] * 4] * BATCH
    assert state.state.tolist() == [[11] * 4] * BATCH
    assert not state.state.flags.writeable
    # A wrong value is refused with the variable's name, and the state stays.
    with pytest.raises(ai.InputTypeError, match="'past'"):
        state.state = np.zeros((BATCH, 4), np.float32)
    with pytest.raises(ai.InputShapeError, match="'past'"):
        state.state = np.zeros((BATCH, 5), np.int64)
    assert state.state.tolist() == [[11] * 4] * BATCH
    # Busy: no change while a step runs.
    request.start_async({"x": x})
    with pytest.raises(ai.RequestBusyError):
        request.query_state()
    with pytest.raises(ai.RequestBusyError):
        state.reset()
    await request.wait()
    assert state.state.tolist() == [[12] * 4] * BATCH
    state.reset()
    assert (await request.infer({"x": x}))["y"].tolist() == [[1] * 4] * BATCH
    request.reset_state()
    # The initial value is sized at the step that uses it: another batch after a reset.
    assert (await request.infer({"x": np.ones((3, 4), np.int64)}))["y"].shape == (3, 4)


@pytest.mark.parametrize("device", DEVICES)
async def test_two_requests_and_pooled_calls_keep_separate_state(compiled, device) -> None:
    model = compiled(device, "accumulator")
    first, second = model.create_infer_request(), model.create_infer_request()
    x = np.ones((BATCH, 4), np.int64)
    for _ in range(3):
        await first.infer({"x": x})
    await second.infer({"x": 2 * x})
    assert first.query_state()[0].state[0].tolist() == [3] * 4
    assert second.query_state()[0].state[0].tolist() == [2] * 4
    # compiled.infer() starts from the initial state on every call.
    for _ in range(2):
        assert (await model.infer({"x": x}))["y"].tolist() == [[1] * 4] * BATCH


# -- atomic steps -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow() -> Iterator[Callable[[str], ai.CompiledModel]]:
    """A stateful chain of 300 MatMul+Tanh pairs: long enough to cancel midway."""
    core = ai.Core()
    made: dict[str, ai.CompiledModel] = {}

    def get(device: str) -> ai.CompiledModel:
        if device not in made:
            model = chain_model(300, 64)
            graph = model.graph
            graph.node[0].input[0] = "start"
            graph.node.insert(0, onnx.helper.make_node("Add", ["x", "state_in"], ["start"]))
            graph.input.append(
                onnx.helper.make_tensor_value_info("state_in", onnx.TensorProto.FLOAT, ["n", 64])
            )
            graph.output.append(
                onnx.helper.make_tensor_value_info("state_out", onnx.TensorProto.FLOAT, ["n", 64])
            )
            graph.node.append(onnx.helper.make_node("Identity", ["y"], ["state_out"]))
            made[device] = core.compile_model(model, device, {"STATEFUL": "auto"})
        return made[device]

    yield get

    async def close_all() -> None:
        for model in made.values():
            await model.close()

    anyio.run(close_all)


@pytest.mark.parametrize("device", DEVICES)
async def test_a_step_cancelled_midway_leaves_the_state_untouched(slow, device) -> None:
    """Cancelled a third of a step's time in (the shortest of a few steps, measured in
    this test; halved after a step that completed anyway): the state is exactly as
    before; a step that completed anyway advanced it."""
    model = slow(device)
    request = model.create_infer_request()
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    durations = []
    for _ in range(3):
        started = anyio.current_time()
        await request.infer({"x": x})
        durations.append(anyio.current_time() - started)
    delay = min(durations) / 3
    cancelled = 0
    for _ in range(30):
        before = state_of(request)["state_in"]
        with anyio.move_on_after(delay) as scope:
            await request.infer({"x": x})
        after = state_of(request)["state_in"]
        if scope.cancelled_caught and isinstance(request.error, ai.InferCancelledError):
            cancelled += 1
            np.testing.assert_array_equal(after, before)
        else:
            assert request.error is None
            assert not np.array_equal(after, before)
            np.testing.assert_array_equal(after, request.results["y"])
            delay /= 2
        if cancelled == 3:
            break
    assert cancelled > 0, "no cancel landed before the commit point"
    # The request goes on from the state it kept.
    expected = (await request.infer({"x": x}))["y"]
    np.testing.assert_array_equal(state_of(request)["state_in"], expected)


@pytest.mark.parametrize("device", DEVICES)
async def test_a_failed_step_leaves_the_state_untouched(compiled, device) -> None:
    request = compiled(device, "accumulator").create_infer_request()
    x = np.ones((BATCH, 4), np.int64)
    await request.infer({"x": x})
    (state,) = request.query_state()
    state.state = np.full((3, 4), 5, np.int64)  # another batch than x's: the step fails
    with pytest.raises((ai.InferenceError, ai.InputShapeError), match=r"past|accumulate"):
        await request.infer({"x": x})
    assert state.state.tolist() == [[5] * 4] * 3
    assert (await request.infer({"x": np.ones((3, 4), np.int64)}))["y"][0].tolist() == [6] * 4


# -- where the state lives ------------------------------------------------------------------


async def test_process_keeps_the_state_in_the_application(compiled) -> None:
    """The worker's model is stateless: the state travels with each inference."""
    model = compiled("PROCESS:CPU", "accumulator")
    assert model.target.get_property("STATEFUL") == {}
    assert [p.name for p in model.target.inputs] == ["x", "past"]
    request = model.create_infer_request()
    await request.infer({"x": np.ones((BATCH, 4), np.int64)})
    assert request.query_state()[0].state.tolist() == [[1] * 4] * BATCH


async def test_cpu_keeps_its_variables_natively(compiled) -> None:
    model = compiled("CPU", "accumulator")
    assert {"ReadValue", "Assign"} <= {node.op_type for node in model.graph}


@pytest.mark.parametrize("device", ["BATCH:CPU", "BATCH:TWOSTAGE", "BATCH:PROCESS:CPU"])
def test_batch_still_refuses_stateful_models(device) -> None:
    with pytest.raises(ai.NotBatchableError, match="stateful"):
        ai.Core().compile_model(accumulator_model(), device, {"STATEFUL": {"past": "present"}})


def test_bad_pairs_fail_before_the_device_compiles() -> None:
    core = ai.Core()
    for device in ("TWOSTAGE", "PROCESS:CPU"):
        with pytest.raises(ai.InvalidPropertyValueError, match="no input named 'nope'"):
            core.compile_model(accumulator_model(), device, {"STATEFUL": {"nope": "present"}})
        with pytest.raises(ai.InvalidPropertyValueError, match="'STATEFUL'"):
            core.compile_model(accumulator_model(), device, {"STATEFUL": 3})


# -- export -----------------------------------------------------------------------------------


async def test_export_and_import_keep_the_state_on_cpu(compiled) -> None:
    case = CASES["lstm"]
    model = compiled("CPU", "lstm")
    imported = ai.Core().import_model(model.export_model(), "CPU")
    assert imported.get_property("STATEFUL") == case.pairs
    assert [p.name for p in imported.inputs] == ["X"]
    request = imported.create_infer_request()
    expected = hand_loop(case, 3)
    for step, (outputs, _) in enumerate(expected):
        results = await request.infer(case.inputs(step))
        assert_close(results["Y"], outputs["Y"], case, f"imported, step {step}")
    for name, value in expected[-1][1].items():
        assert_close(state_of(request)[name], value, case, f"imported: {name}")
    request.reset_state()
    assert not state_of(request)["h0"].any()
    await imported.close()


def test_a_stateful_model_kept_above_the_device_is_not_exported(compiled) -> None:
    with pytest.raises(ai.ExportError, match=r"'TWOSTAGE'.*above the device"):
        compiled("TWOSTAGE", "accumulator").export_model()


async def test_the_model_cache_keeps_the_device_s_model_under_the_state_layer(tmp_path) -> None:
    """With CACHE_DIR, the Core caches what TWOSTAGE compiled (state ports included); the
    variables are added above the cached model, and stay per request."""
    core = ai.Core()
    case = CASES["lstm"]
    config = {"STATEFUL": case.stateful, "CACHE_DIR": str(tmp_path)}
    first = core.compile_model(case.build(), "TWOSTAGE", config)
    cached = core.compile_model(case.build(), "TWOSTAGE", config)
    assert len(list(tmp_path.iterdir())) == 1
    assert first.get_property("LOADED_FROM_CACHE") is False
    assert cached.get_property("LOADED_FROM_CACHE") is True
    assert cached.get_property("STATEFUL") == case.pairs
    assert [p.name for p in cached.inputs] == ["X"]
    request = cached.create_infer_request()
    expected = hand_loop(case, 3)
    for step, (outputs, _) in enumerate(expected):
        results = await request.infer(case.inputs(step))
        assert_close(results["Y"], outputs["Y"], case, f"cached, step {step}")
    for name, value in expected[-1][1].items():
        assert_close(state_of(request)[name], value, case, f"cached: {name}")
    with pytest.raises(ai.ExportError, match="above the device"):
        cached.export_model()
    await first.close()
    await cached.close()


# -- a state's unknown dimension that only the batch can be ------------------------------------


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (lambda: vad_model([2, None, None]), "two unknown dimensions"),
        (lambda: vad_model(second=True), "inputs leading with different dimensions"),
    ],
)
async def test_an_ambiguous_unknown_dimension_is_still_refused(build, why) -> None:
    compiled = ai.Core().compile_model(build(), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    inputs = {"input": np.ones((BATCH, 512), np.float32), "sr": np.array(16000, np.int64)}
    if "extra" in [p.name for p in compiled.inputs]:
        inputs["extra"] = np.ones((1, 4), np.float32)
    with pytest.raises(ai.MissingInputError, match=r"dimension \d of its shape .* is unknown"):
        await request.infer(inputs)
    # Set from outside, the state runs (``why`` is what keeps it from being sized).
    request.query_state()[0].state = np.zeros((2, BATCH, 128), np.float32)
    assert (await request.infer(inputs))["output"].shape == (BATCH, 1), why
    await compiled.close()
