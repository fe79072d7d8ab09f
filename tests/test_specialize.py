"""Plans specialised per input shapes: shape chains folded, shape-dependent If inlined.

Every model here has symbolic input dimensions, so the compile-time passes cannot fold
the shape computations: only the request's specialising run can. Results are checked
against onnx.reference (float32, rtol 1e-6, atol 1e-6: the same kernels compute them).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
from onnx.reference import ReferenceEvaluator

import aioinfer as ai
from aioinfer.devices.cpu.plan import Plan
from aioinfer.devices.cpu.request import CPU_TIME_EVERY
from aioinfer.devices.cpu.specialize import FOLD_BYTES
from aioinfer.plugin.sync_request import CancelToken
from tests.helpers import make_model, tensor_info

RNG = np.random.default_rng(21)
SHAPE_OPS = {"If", "Shape", "Size", "Gather", "Equal", "Identity", "Cast"}


def _const(name: str, value: Any, dtype: type = np.int64) -> onnx.NodeProto:
    return oh.make_node(
        "Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(value, dtype))
    )


def _single_row(one: str) -> list[onnx.NodeProto]:
    """Nodes computing ``single``: whether ``x`` has one row (the constant 1 named
    ``one``)."""
    return [
        oh.make_node("Shape", ["x"], ["shape"]),
        _const("zero", 0),
        oh.make_node("Gather", ["shape", "zero"], ["rows"]),
        _const(one, 1),
        oh.make_node("Equal", ["rows", one], ["single"]),
    ]


def _graph(
    name: str, nodes: list[onnx.NodeProto], outputs: list[str], shape: list[Any] | None = None
) -> onnx.GraphProto:
    """A branch of If: no inputs, float outputs of ``shape`` (default: rank 1)."""
    return oh.make_graph(
        nodes, name, [], [tensor_info(o, np.float32, shape or ["k"]) for o in outputs]
    )


def _squeeze_if_one_model() -> onnx.ModelProto:
    """``y = (squeeze(x, 0) * 2 if x.shape[0] == 1 else sum(x, 0) [+ 1 if x.shape[1] == 3])
    + size(x)``: two shape-dependent Ifs, the second nested in the first's else branch,
    and an Identity before the output."""
    inner = oh.make_node(
        "If",
        ["wide"],
        ["summed"],
        then_branch=_graph(
            "plus_one",
            [_const("one", 1.0, np.float32), oh.make_node("Add", ["reduced", "one"], ["out"])],
            ["out"],
        ),
        else_branch=_graph("as_is", [oh.make_node("Identity", ["reduced"], ["out2"])], ["out2"]),
    )
    else_nodes = [
        _const("axis0", [0]),
        oh.make_node("ReduceSum", ["x", "axis0"], ["reduced"], keepdims=0),
        _const("one_i", 1),
        oh.make_node("Gather", ["shape", "one_i"], ["cols"]),
        _const("three", 3),
        oh.make_node("Equal", ["cols", "three"], ["wide"]),
        inner,
    ]
    top_if = oh.make_node(
        "If",
        ["single"],
        ["picked"],
        then_branch=_graph(
            "squeeze",
            [
                _const("axes", [0]),
                oh.make_node("Squeeze", ["x", "axes"], ["squeezed"]),
                _const("two", 2.0, np.float32),
                oh.make_node("Mul", ["squeezed", "two"], ["doubled"]),
            ],
            ["doubled"],
        ),
        else_branch=_graph("sum", else_nodes, ["summed"]),
    )
    nodes = [
        *_single_row("one_row"),
        top_if,
        oh.make_node("Size", ["x"], ["size"]),
        oh.make_node("Cast", ["size"], ["size_f"], to=onnx.TensorProto.FLOAT),
        oh.make_node("Add", ["picked", "size_f"], ["total"]),
        oh.make_node("Identity", ["total"], ["y"]),
    ]
    return make_model(
        nodes, [tensor_info("x", np.float32, ["n", "m"])], [tensor_info("y", np.float32, ["k"])]
    )


def _specialized(request: ai.InferRequest) -> Plan:
    inner = request._request  # type: ignore[attr-defined]
    plan = inner.memory.plan(inner.input_shapes())
    assert plan is not None
    return plan  # type: ignore[no-any-return]


def _op_types(plan: Plan) -> set[str]:
    return {step.op_type for step in plan.steps}


def test_shape_dependent_ifs_are_inlined_and_shape_chains_folded() -> None:
    model = _squeeze_if_one_model()
    reference = ReferenceEvaluator(model)
    request = ai.Core().compile_model(model, "CPU").create_infer_request()
    original = request._request._plan  # type: ignore[attr-defined]
    assert {"If", "Shape", "Size"} <= _op_types(original)
    for shape in [(1, 3), (2, 3), (2, 5), (1, 3), (4, 3), (4, 3)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        y = request.infer_sync({"x": x})["y"]
        np.testing.assert_allclose(y, reference.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
        # Left: the branch's arithmetic and the final Add, no shape op, If or Identity.
        kept = _op_types(_specialized(request))
        assert not kept & SHAPE_OPS, (shape, kept)
        assert "Add" in kept


def _data_if_model() -> onnx.ModelProto:
    """``y = x * 2 if sum(x) > 0 else (sum(x, 0) if x.shape[0] == 1 else -x)``: an If on
    data, whose else branch holds a shape-dependent If."""
    nested = oh.make_node(
        "If",
        ["single"],
        ["inner_out"],
        then_branch=_graph(
            "sum",
            [_const("axes", [0]), oh.make_node("ReduceSum", ["x", "axes"], ["summed"])],
            ["summed"],
            ["r", 3],
        ),
        else_branch=_graph(
            "negate", [oh.make_node("Neg", ["x"], ["negated"])], ["negated"], ["r", 3]
        ),
    )
    else_nodes = [
        *_single_row("one"),
        nested,
    ]
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        _const("zero_f", 0.0, np.float32),
        oh.make_node("Greater", ["total", "zero_f"], ["positive"]),
        oh.make_node(
            "If",
            ["positive"],
            ["y"],
            then_branch=_graph(
                "double",
                [_const("two", 2.0, np.float32), oh.make_node("Mul", ["x", "two"], ["out"])],
                ["out"],
                ["r", 3],
            ),
            else_branch=_graph("shaped", else_nodes, ["inner_out"], ["r", 3]),
        ),
    ]
    return make_model(
        nodes, [tensor_info("x", np.float32, ["n", 3])], [tensor_info("y", np.float32, ["r", 3])]
    )


def _runs_subplans(plan: Plan) -> bool:
    return any(step.subplans for step in plan.steps)


def test_an_if_on_data_is_guessed_then_stays_and_runs_its_branch_specialised() -> None:
    """The first plan inlines the branch the data took, behind a guard; once the data
    takes the other branch, the If stays a step (and its branch runs specialised)."""
    model = _data_if_model()
    reference = ReferenceEvaluator(model)
    request = ai.Core().compile_model(model, "CPU").create_infer_request()
    for run, (sign, rows) in enumerate([(1, 1), (1, 1), (-1, 1), (1, 1), (-1, 2), (-1, 1)]):
        x = (sign * np.abs(RNG.standard_normal((rows, 3)))).astype(np.float32)
        y = request.infer_sync({"x": x})["y"]
        np.testing.assert_allclose(y, reference.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
        # Runs 0 and 1: the guessed plan (a guard, no sub-plan); then the If itself.
        assert _runs_subplans(_specialized(request)) == (run >= 2)
    (step,) = [s for s in _specialized(request).steps if s.subplans]
    branch = step.subplans["else_branch"]
    assert {"If", "Shape"} <= _op_types(branch)
    # One version per shape of x it ran with ((1, 3) and (2, 3)), each without shape ops.
    versions = list(branch.specialized.values())
    assert len(versions) == 2
    assert all(not _op_types(v) & SHAPE_OPS for v in versions)


def test_the_shape_of_a_data_dependent_value_is_not_folded() -> None:
    """NonZero's output shape depends on the data (and so does that of anything made
    from it): a branch chosen from it is chosen again on every run, inputs of the same
    shape or not."""
    nodes = [
        _const("zero_f", 0.0, np.float32),
        oh.make_node("Greater", ["x", "zero_f"], ["mask"]),
        oh.make_node("NonZero", ["mask"], ["where"]),
        # Cast keeps its input's shape: data-dependent here too.
        oh.make_node("Cast", ["where"], ["where_f"], to=onnx.TensorProto.FLOAT),
        oh.make_node("Shape", ["where_f"], ["shape"]),
        _const("one", 1),
        oh.make_node("Gather", ["shape", "one"], ["count"]),
        _const("two", 2),
        oh.make_node("Equal", ["count", "two"], ["is_two"]),
        oh.make_node(
            "If",
            ["is_two"],
            ["y"],
            then_branch=_graph("yes", [_const("a", [1.0], np.float32)], ["a"]),
            else_branch=_graph("no", [_const("b", [0.0], np.float32)], ["b"]),
        ),
    ]
    model = make_model(
        nodes, [tensor_info("x", np.float32, ["n"])], [tensor_info("y", np.float32, [1])]
    )
    request = ai.Core().compile_model(model, "CPU").create_infer_request()
    for values in ([1, 1, -1, -1], [1, -1, -1, -1], [1, 1, -1, -1], [1, 1, 1, -1]):
        x = np.array(values, np.float32)
        expected = [1.0] if sum(v > 0 for v in values) == 2 else [0.0]
        np.testing.assert_array_equal(request.infer_sync({"x": x})["y"], expected)


def _constant_of_shape_model(op: str) -> onnx.ModelProto:
    """``y = x + op(ConstantOfShape(shape(x), 1))``."""
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node(
            "ConstantOfShape",
            ["shape"],
            ["ones"],
            value=onnx.numpy_helper.from_array(np.array([1.0], np.float32)),
        ),
        oh.make_node(op, ["ones"], ["made"]),
        oh.make_node("Add", ["x", "made"], ["y"]),
    ]
    return make_model(
        nodes, [tensor_info("x", np.float32, ["n"])], [tensor_info("y", np.float32, ["n"])]
    )


def test_random_operators_are_never_folded() -> None:
    request = (
        ai.Core().compile_model(_constant_of_shape_model("RandomUniformLike"), "CPU")
    ).create_infer_request()
    x = np.zeros(64, np.float32)
    first = request.infer_sync({"x": x})["y"]
    second = request.infer_sync({"x": x})["y"]
    assert not np.array_equal(first, second)
    assert "RandomUniformLike" in _op_types(_specialized(request))
    assert "ConstantOfShape" not in _op_types(_specialized(request))  # folded: 256 bytes


def test_large_static_values_stay_computed() -> None:
    request = (
        ai.Core().compile_model(_constant_of_shape_model("Neg"), "CPU")
    ).create_infer_request()
    small = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(request.infer_sync({"x": small})["y"], small - 1)
    assert _op_types(_specialized(request)) == {"Add"}
    large = np.arange(FOLD_BYTES // 4 + 1, dtype=np.float32)
    np.testing.assert_array_equal(request.infer_sync({"x": large})["y"], large - 1)
    assert _op_types(_specialized(request)) == {"ConstantOfShape", "Neg", "Add"}


def test_the_plan_runs_alike_on_the_main_thread_and_on_a_compute_thread() -> None:
    """Steps of every form (one input, several, an omitted optional input, several
    outputs) through the loop without clock readings (main thread) and the timed one."""
    nodes = [
        oh.make_node("Neg", ["x"], ["n"]),
        oh.make_node("Split", ["n"], ["a", "b"], axis=0, num_outputs=2),
        oh.make_node("Sub", ["a", "b"], ["d"]),
        oh.make_node("Pad", ["d", "pads", ""], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [4, "m"])],
        [tensor_info("y", np.float32, [5, "k"])],
        {"pads": np.array([1, 0, 0, 2], np.int64)},
    )
    compiled = ai.Core().compile_model(model, "CPU")
    plan: Plan = compiled.plan  # type: ignore[attr-defined]
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    on_main = plan.run([x], CancelToken())[0]
    on_thread: list[Any] = []
    worker = threading.Thread(target=lambda: on_thread.append(plan.run([x], CancelToken())[0]))
    worker.start()
    worker.join()
    np.testing.assert_allclose(on_main, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(on_thread[0], on_main)


def test_cpu_time_of_short_runs_is_measured_one_run_in_a_few() -> None:
    """Reading the thread's CPU clock costs a system call: once a run on these shapes
    is known to be short (a budget no run reaches), runs between samples leave the
    running average of the shapes' run time exactly as it was."""
    model = _squeeze_if_one_model()
    compiled = ai.Core().compile_model(model, "CPU", {"CPU_INLINE_RUN_US": 10**8})
    request = compiled.create_infer_request()
    times = compiled.run_times  # type: ignore[attr-defined]
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    request.infer_sync({"x": x})
    (key,) = times.seconds
    first = times.seconds[key]
    for _ in range(CPU_TIME_EVERY - 1):
        request.infer_sync({"x": x})
        assert times.seconds[key] == first
    request.infer_sync({"x": x})
    assert times.seconds[key] != first


def test_cpu_time_of_runs_that_are_not_short_is_always_measured() -> None:
    """Runs that would not go inline (here: inline runs off) are measured every time, so
    the average that may bring a model's runs inline follows every run."""
    compiled = ai.Core().compile_model(_squeeze_if_one_model(), "CPU", {"CPU_INLINE_RUN_US": 0})
    request = compiled.create_infer_request()
    times = compiled.run_times  # type: ignore[attr-defined]
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    seen = []
    for _ in range(CPU_TIME_EVERY + 1):
        request.infer_sync({"x": x})
        seen.extend(times.seconds.values())
    assert len(set(seen)) == len(seen)


def _mode_model() -> onnx.ModelProto:
    """``y = (sum(x, 0) if x.shape[0] == 1 else -x) if mode == 1 else 2 * x``: an If on an
    input value (as Silero VAD's on its sample rate), a shape-dependent If inside."""
    nested = oh.make_node(
        "If",
        ["single"],
        ["inner"],
        then_branch=_graph(
            "sum", [_const("a", [0]), oh.make_node("ReduceSum", ["x", "a"], ["s"])], ["s"], ["r", 3]
        ),
        else_branch=_graph("neg", [oh.make_node("Neg", ["x"], ["n"])], ["n"], ["r", 3]),
    )
    then_nodes = [
        *_single_row("one"),
        nested,
    ]
    nodes = [
        _const("wanted", 1),
        oh.make_node("Equal", ["mode", "wanted"], ["is_one"]),
        oh.make_node(
            "If",
            ["is_one"],
            ["y"],
            then_branch=_graph("shaped", then_nodes, ["inner"], ["r", 3]),
            else_branch=_graph(
                "double",
                [_const("two", 2.0, np.float32), oh.make_node("Mul", ["x", "two"], ["d"])],
                ["d"],
                ["r", 3],
            ),
        ),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, ["n", 3]), tensor_info("mode", np.int64, [])],
        [tensor_info("y", np.float32, ["r", 3])],
    )
    return model


def test_a_guessed_branch_on_an_input_value_is_inlined_until_the_value_changes() -> None:
    """As Silero VAD's If on its sample-rate input: while ``mode`` stays 1, the plan
    runs the then branch inline (with its own shape-dependent If resolved: no sub-plan
    at all); a run with mode 0 gets the else branch's results (not the guessed one's),
    and so do all later runs, whichever the mode."""
    model = _mode_model()
    reference = ReferenceEvaluator(model)
    request = ai.Core().compile_model(model, "CPU").create_infer_request()
    for run, mode in enumerate([1, 1, 1, 0, 1, 0]):
        feeds = {"x": RNG.standard_normal((1, 3)).astype(np.float32), "mode": np.array(mode)}
        y = request.infer_sync(feeds)["y"]
        np.testing.assert_allclose(y, reference.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
        plan = _specialized(request)
        assert _runs_subplans(plan) == (run >= 3)
        if run < 3:
            assert _op_types(plan) == {"Equal", "If", "ReduceSum"}  # the If: its guard


def test_a_profiled_run_that_takes_the_other_branch_reports_the_run_that_completed() -> None:
    """With PERF_COUNT, the run whose guard saw the other branch is redone: the profile
    lists the steps of that run (the else branch's Mul), not of the stopped one."""
    model = _mode_model()
    compiled = ai.Core().compile_model(model, "CPU", {"PERF_COUNT": True})
    request = compiled.create_infer_request()
    reference = ReferenceEvaluator(model)
    for mode in (1, 1, 0):
        feeds = {"x": RNG.standard_normal((1, 3)).astype(np.float32), "mode": np.array(mode)}
        y = request.infer_sync(feeds)["y"]
        np.testing.assert_allclose(y, reference.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
    nodes = [e["op_type"] for e in request.get_profiling_info() if e["type"] == "node"]
    assert nodes == ["Equal", "If"]  # the If a step again, its branch inside it
