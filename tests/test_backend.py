"""aioinfer.backend (the ONNX backend API), sequence and optional ports, and the machinery
conformance relies on: control flow through sub-plans (captured values, cancellation),
fallback kernels and their precedence.

Values are compared with ``onnx.reference`` (float32: rtol 1e-6, atol 1e-6) or exactly.
"""

from __future__ import annotations

import threading
import time

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx.backend.test.runner import Runner
from onnx.reference import ReferenceEvaluator

import aioinfer as ai
import aioinfer.backend as backend
from aioinfer.devices.cpu.kernels import registry
from aioinfer.devices.cpu.kernels.fallback import FALLBACK_OPERATORS
from aioinfer.devices.cpu.plan import current_cancel_token
from aioinfer.plugin.sync_request import CancelToken
from tests.helpers import make_model, tensor_info

RTOL = ATOL = 1e-6


def add_model() -> onnx.ModelProto:
    return make_model(
        [oh.make_node("Add", ["a", "b"], ["y"])],
        [tensor_info("a", np.float32, [2]), tensor_info("b", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
    )


# -- the backend API ----------------------------------------------------------------------


def test_prepare_and_run_by_position_name_and_single_array() -> None:
    rep = backend.prepare(add_model(), "CPU")
    a, b = np.float32([1, 2]), np.float32([10, 20])
    by_position = rep.run([a, b])
    np.testing.assert_array_equal(by_position[0], [11, 22])
    np.testing.assert_array_equal(by_position["y"], [11, 22])
    np.testing.assert_array_equal(rep.run({"b": b, "a": a}).y, [11, 22])
    single = backend.prepare(
        make_model(
            [oh.make_node("Neg", ["x"], ["y"])],
            [tensor_info("x", np.float32, [2])],
            [tensor_info("y", np.float32, [2])],
        )
    )
    np.testing.assert_array_equal(single.run(np.float32([1, -2]))[0], [-1, 2])


def test_run_model_and_devices() -> None:
    (y,) = backend.run_model(add_model(), [np.float32([1, 1]), np.float32([2, 3])], "CPU:0")
    np.testing.assert_array_equal(y, [3, 4])
    assert backend.supports_device("CPU") and backend.supports_device("CPU:0")
    assert not backend.supports_device("CUDA")
    with pytest.raises(ai.UnknownDeviceError, match=r"'CUDA'.*available: .*CPU"):
        backend.prepare(add_model(), "CUDA")


def test_run_node_types_outputs_by_inference() -> None:
    node = oh.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)
    x = np.float32([[3, 1, 2], [0, 5, 4]])
    values, indices = backend.run_node(node, [x, np.int64([2])])
    np.testing.assert_array_equal(values, [[3, 2], [5, 4]])
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices, [[0, 2], [1, 2]])
    (old,) = backend.run_node(oh.make_node("Relu", ["x"], ["y"]), [x - 2], opset_version=7)
    np.testing.assert_array_equal(old, np.maximum(x - 2, 0))


def test_run_node_errors_name_the_problem() -> None:
    with pytest.raises(ai.InvalidModelError, match="Relu node has 1 inputs, 2 values"):
        backend.run_node(oh.make_node("Relu", ["x"], ["y"]), [np.float32([1]), np.float32([2])])
    custom = oh.make_node("Mystery", ["x"], ["y"], domain="example.custom")
    with pytest.raises(ai.InvalidModelError, match=r"output 'y' .* cannot be inferred"):
        backend.run_node(custom, [np.float32([1])])
    with pytest.raises(ai.UnsupportedOperatorError, match=r"example.custom::Mystery"):
        backend.run_node(custom, [np.float32([1])], outputs_info=[(np.float32, (1,))])


def test_bad_inputs_raise_and_the_rep_stays_usable() -> None:
    rep = backend.prepare(add_model())
    with pytest.raises(ai.InputTypeError, match="'a': expected element type float32, got int64"):
        rep.run([np.int64([1, 2]), np.float32([1, 2])])
    with pytest.raises(ai.InputError, match="3 inputs given by position, the model has 2"):
        rep.run([np.float32([1, 2])] * 3)
    np.testing.assert_array_equal(rep.run([np.float32([1, 2]), np.float32([1, 2])])[0], [2, 4])


def test_positions_skip_initializers_listed_as_graph_inputs() -> None:
    model = make_model(
        [oh.make_node("Add", ["w", "x"], ["y"])],
        [tensor_info("w", np.float32, [2]), tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
        {"w": np.float32([1, 1])},
    )
    rep = backend.prepare(model)
    np.testing.assert_array_equal(rep.run([np.float32([1, 2])])[0], [2, 3])
    with pytest.raises(ai.UnknownInputError, match="no input named 'w'"):
        rep.run({"w": np.float32([5, 5])})


def test_outputs_satisfy_the_onnx_runner() -> None:
    """ONNX's backend runner compares ``rep.run`` outputs with its own rules: tensors and
    sequences (lists) from aioinfer pass them."""
    rep = backend.prepare(sequence_model())
    x = np.float32([4, 5])
    got = list(rep.run([[np.float32([1, 2])], x, x]))
    expected = [np.array(1), np.array(True), [np.float32([1, 2]), x]]
    Runner.assert_similar_outputs(expected, got, rtol=1e-3, atol=1e-7)
    with pytest.raises(AssertionError):
        Runner.assert_similar_outputs([np.array(2), *expected[1:]], got, rtol=1e-3, atol=1e-7)


# -- sequence and optional ports -----------------------------------------------------------


def sequence_model() -> onnx.ModelProto:
    """seq (sequence of float) and an optional tensor in; their length and the optional's
    presence out, and the sequence with x appended."""
    return make_model(
        [
            oh.make_node("SequenceLength", ["seq"], ["length"]),
            oh.make_node("OptionalHasElement", ["maybe"], ["present"]),
            oh.make_node("SequenceInsert", ["seq", "x"], ["grown"]),
        ],
        [
            oh.make_tensor_sequence_value_info("seq", TP.FLOAT, None),
            oh.make_value_info(
                "maybe", oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None))
            ),
            tensor_info("x", np.float32, [2]),
        ],
        [
            tensor_info("length", np.int64, []),
            tensor_info("present", np.bool_, []),
            oh.make_tensor_sequence_value_info("grown", TP.FLOAT, None),
        ],
    )


def test_sequence_and_optional_ports() -> None:
    compiled = ai.Core().compile_model(sequence_model())
    kinds = {p.name: p.kind for p in compiled.inputs}
    assert kinds == {"seq": "sequence", "maybe": "optional", "x": "tensor"}
    assert str(compiled.input("seq")) == "seq: sequence(float?)"
    assert str(compiled.input("maybe")) == "maybe: optional(float?)"
    request = compiled.create_infer_request()
    seq = [np.float32([1]), np.float32([2, 3])]
    x = np.float32([4, 5])
    results = request.infer_sync({"seq": seq, "maybe": None, "x": x})
    assert results["length"] == 2 and not results["present"]
    assert [a.tolist() for a in results["grown"]] == [[1], [2, 3], [4, 5]]
    assert len(seq) == 2  # the user's list is not modified
    results["grown"][0][0] = 9  # results never alias the user's arrays
    assert seq[0][0] == 1
    fresh = compiled.create_infer_request()
    omitted = fresh.infer_sync({"seq": [], "x": x})  # an optional never set is empty
    assert omitted["length"] == 0 and not omitted["present"]
    assert request.infer_sync({"seq": [x], "maybe": x, "x": x})["present"]


def test_sequence_port_errors() -> None:
    request = ai.Core().compile_model(sequence_model()).create_infer_request()
    x = np.float32([1, 2])
    with pytest.raises(ai.InputTypeError, match=r"'seq': expected a sequence .* got ndarray"):
        request.infer_sync({"seq": x, "x": x})
    with pytest.raises(ai.InputTypeError, match="'seq': expected element type float32, got int32"):
        request.infer_sync({"seq": [np.int32([1])], "x": x})
    with pytest.raises(ai.InputTypeError, match="'seq': expected a sequence of tensors, got None"):
        request.infer_sync({"seq": None, "x": x})
    with pytest.raises(ai.MissingInputError, match="'seq'"):
        ai.Core().compile_model(sequence_model()).create_infer_request().infer_sync({"x": x})
    assert request.infer_sync({"seq": [x], "x": x})["length"] == 1


def test_constant_sequences_are_not_folded_into_tensors() -> None:
    model = make_model(
        [
            oh.make_node("SequenceConstruct", ["c1", "c2"], ["pair"]),
            oh.make_node("SequenceEmpty", [], ["empty"]),
            oh.make_node("SequenceInsert", ["empty", "x"], ["one"]),
            oh.make_node("Optional", [], ["nothing"], type=oh.make_tensor_type_proto(TP.FLOAT, [])),
            oh.make_node("OptionalHasElement", ["nothing"], ["has"]),
        ],
        [tensor_info("x", np.float32, [2])],
        [
            oh.make_tensor_sequence_value_info("pair", TP.FLOAT, None),
            oh.make_tensor_sequence_value_info("one", TP.FLOAT, None),
            tensor_info("has", np.bool_, []),
        ],
        {"c1": np.float32([1, 2]), "c2": np.float32([3, 4])},
    )
    pair, one, has = backend.prepare(model).run([np.float32([5, 6])])
    assert isinstance(pair, list) and [a.tolist() for a in pair] == [[1, 2], [3, 4]]
    assert isinstance(one, list) and [a.tolist() for a in one] == [[5, 6]]
    assert not has


def test_string_outputs_are_object_arrays() -> None:
    model = make_model(
        [oh.make_node("Cast", ["x"], ["y"], to=TP.STRING)],
        [tensor_info("x", np.int64, [2])],
        [oh.make_tensor_value_info("y", TP.STRING, [2])],
    )
    rep = backend.prepare(model)
    (y,) = rep.run([np.int64([7, -1])])
    assert y.dtype == object and y.tolist() == ["7", "-1"]
    strings = make_model(
        [oh.make_node("Identity", ["s"], ["t"])],
        [oh.make_tensor_value_info("s", TP.STRING, [1])],
        [oh.make_tensor_value_info("t", TP.STRING, [1])],
    )
    # numpy str arrays are accepted for string inputs
    assert backend.prepare(strings).run([np.array(["é"])])[0].tolist() == ["é"]


# -- control flow through sub-plans ---------------------------------------------------------


def loop_with_captures() -> onnx.ModelProto:
    """Loop whose body reads ``w`` and ``bias`` from the outer graph, inside an If that
    reads ``w`` too (a capture two levels deep); scan output collects each step."""
    then_branch = oh.make_graph(
        [oh.make_node("Add", ["acc_in", "w"], ["then_out"])],
        "then",
        [],
        [tensor_info("then_out", np.float32, [2])],
    )
    else_branch = oh.make_graph(
        [oh.make_node("Sub", ["acc_in", "bias"], ["else_out"])],
        "else",
        [],
        [tensor_info("else_out", np.float32, [2])],
    )
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Mod", ["i", "two"], ["parity"]),
            oh.make_node("Equal", ["parity", "zero"], ["even"]),
            oh.make_node(
                "If", ["even"], ["acc_out"], then_branch=then_branch, else_branch=else_branch
            ),
            oh.make_node("Mul", ["acc_out", "w"], ["scanned"]),
        ],
        "body",
        [
            tensor_info("i", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("acc_in", np.float32, [2]),
        ],
        [
            tensor_info("cond_out", np.bool_, []),
            tensor_info("acc_out", np.float32, [2]),
            tensor_info("scanned", np.float32, [2]),
        ],
    )
    return make_model(
        [oh.make_node("Loop", ["n", "keep", "acc0"], ["acc", "steps"], body=body)],
        [
            tensor_info("n", np.int64, []),
            tensor_info("keep", np.bool_, []),
            tensor_info("acc0", np.float32, [2]),
            tensor_info("w", np.float32, [2]),
            tensor_info("bias", np.float32, [2]),
        ],
        [tensor_info("acc", np.float32, [2]), tensor_info("steps", np.float32, [None, 2])],
        {"two": np.int64(2), "zero": np.int64(0)},
    )


def test_loop_and_if_read_outer_values() -> None:
    model = loop_with_captures()
    feeds = {
        "n": np.int64(5),
        "keep": np.bool_(True),
        "acc0": np.float32([1, 2]),
        "w": np.float32([0.5, -1]),
        "bias": np.float32([3, 4]),
    }
    got = backend.prepare(model).run(feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert got.steps.shape == (5, 2)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def scan_model(axes: list[int], directions: list[int], out_axes: list[int]) -> onnx.ModelProto:
    """Scan summing rows of x into a running state; scan output: state after each step."""
    body = oh.make_graph(
        [
            oh.make_node("Add", ["s_in", "row"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["y"]),
        ],
        "body",
        [tensor_info("s_in", np.float32, [3]), tensor_info("row", np.float32, [3])],
        [tensor_info("s_out", np.float32, [3]), tensor_info("y", np.float32, [3])],
    )
    node = oh.make_node(
        "Scan",
        ["s0", "x"],
        ["s", "ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=axes,
        scan_input_directions=directions,
        scan_output_axes=out_axes,
    )
    return make_model(
        [node],
        [tensor_info("s0", np.float32, [3]), tensor_info("x", np.float32, [None, None])],
        [tensor_info("s", np.float32, [3]), tensor_info("ys", np.float32, [None, None])],
    )


@pytest.mark.parametrize(
    ("axes", "directions", "out_axes"),
    [([0], [0], [0]), ([1], [0], [0]), ([0], [1], [0]), ([0], [0], [-1]), ([-1], [1], [1])],
)
def test_scan_axes_and_directions(
    axes: list[int], directions: list[int], out_axes: list[int]
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    if axes[0] % 2 == 1:
        x = np.ascontiguousarray(x.T)  # scanning axis 1 of a (3, 4) array
    s0 = np.float32([1, 0, -1])
    rows = np.moveaxis(x, axes[0], 0)
    rows = rows[::-1] if directions[0] else rows
    states = s0 + np.cumsum(rows, axis=0)
    s, ys = backend.prepare(scan_model(axes, directions, out_axes)).run([s0, x])
    np.testing.assert_array_equal(s, states[-1])
    np.testing.assert_array_equal(ys, np.moveaxis(states, 0, out_axes[0]))


def test_a_failing_body_node_is_named_and_the_request_stays_usable() -> None:
    then_branch = oh.make_graph(
        [oh.make_node("Reshape", ["x", "shape"], ["y_then"], name="inner_reshape")],
        "then",
        [],
        [tensor_info("y_then", np.float32, [None, None])],
    )
    else_branch = oh.make_graph(
        [oh.make_node("Reshape", ["x", "fixed"], ["y_else"])],
        "else",
        [],
        [tensor_info("y_else", np.float32, [None, None])],
    )
    model = make_model(
        [
            oh.make_node(
                "If", ["c"], ["y"], name="branch", then_branch=then_branch, else_branch=else_branch
            )
        ],
        [
            tensor_info("c", np.bool_, []),
            tensor_info("x", np.float32, [6]),
            tensor_info("shape", np.int64, [2]),
        ],
        [tensor_info("y", np.float32, [None, None])],
        {"fixed": np.int64([3, 2])},
    )
    rep = backend.prepare(model)
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(ai.InferenceError, match=r"'branch' \(If\).*'inner_reshape' \(Reshape\)"):
        rep.run([np.bool_(True), x, np.int64([4, 4])])
    assert rep.run([np.bool_(True), x, np.int64([2, 3])])[0].shape == (2, 3)
    assert rep.run([np.bool_(False), x, np.int64([4, 4])])[0].shape == (3, 2)


def infinite_loop_model() -> onnx.ModelProto:
    """A Loop with neither trip count nor condition that stops: only cancellation ends it."""
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Add", ["x_in", "one"], ["x_out"]),
        ],
        "body",
        [
            tensor_info("i", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("x_in", np.float32, [1]),
        ],
        [tensor_info("cond_out", np.bool_, []), tensor_info("x_out", np.float32, [1])],
    )
    return make_model(
        [oh.make_node("Loop", ["", "", "x"], ["y"], body=body)],
        [tensor_info("x", np.float32, [1])],
        [tensor_info("y", np.float32, [1])],
        {"one": np.float32([1])},
    )


@pytest.mark.anyio
async def test_cancel_stops_inside_a_loop_body() -> None:
    compiled = await ai.Core().compile_model_async(infinite_loop_model())
    request = compiled.create_infer_request()
    request.start_async({"x": np.float32([0])})
    await anyio.sleep(0.05)
    request.cancel()
    # The loop never ends by itself: without a cancel checked in the body, the guard fails.
    with pytest.raises(ai.InferCancelledError), anyio.fail_after(60):
        await request.wait()
    # the request is reusable: a finite loop on another model's request, then this one again
    feeds = {
        "n": np.int64(2),
        "keep": np.bool_(True),
        "acc0": np.float32([0, 0]),
        "w": np.float32([1, 1]),
        "bias": np.float32([0, 0]),
    }
    other = ai.Core().compile_model(loop_with_captures()).create_infer_request()
    assert (await other.infer(feeds))["steps"].shape == (2, 2)
    request.start_async({"x": np.float32([0])})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    await compiled.close()


def test_current_cancel_token_follows_the_running_plan() -> None:
    assert not current_cancel_token().requested  # outside a plan: a fresh token
    seen: list[CancelToken] = []
    token = CancelToken()

    def kernel_factory(spec: registry.NodeSpec) -> registry.Kernel:
        return lambda x: (seen.append(current_cancel_token()) or x,)

    key = ("test.aioinfer", "RecordToken")
    saved = registry._REGISTRY.pop(key, None)
    try:
        registry.kernel("RecordToken", domain="test.aioinfer")(kernel_factory)
        model = make_model(
            [oh.make_node("RecordToken", ["x"], ["y"], domain="test.aioinfer")],
            [tensor_info("x", np.float32, [1])],
            [tensor_info("y", np.float32, [1])],
            opsets={"": 18, "test.aioinfer": 1},
        )
        compiled = ai.Core().compile_model(model, "CPU")
        compiled.plan.run([np.float32([1])], token)  # type: ignore[attr-defined]
    finally:
        registry._REGISTRY.pop(key, None)
        if saved is not None:
            registry._REGISTRY[key] = saved
    assert seen == [token]
    assert not current_cancel_token().requested and current_cancel_token() is not token


def test_cancelling_one_thread_does_not_reach_another() -> None:
    compiled = ai.Core().compile_model(infinite_loop_model(), "CPU")
    plan = compiled.plan  # type: ignore[attr-defined]
    tokens = [CancelToken(), CancelToken()]
    errors: list[BaseException] = []

    def run(token: CancelToken) -> None:
        try:
            plan.run([np.float32([0])], token)
        except ai.InferCancelledError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in tokens]
    for thread in threads:
        thread.start()
    time.sleep(0.02)
    tokens[0].requested = True
    threads[0].join(60)  # a hang guard: the loops never end by themselves
    assert not threads[0].is_alive() and threads[1].is_alive()
    tokens[1].requested = True
    threads[1].join(60)
    assert len(errors) == 2


# -- fallback kernels -----------------------------------------------------------------------


def test_fallback_nodes_report_their_execution_type() -> None:
    model = make_model(
        [
            oh.make_node("StringConcat", ["a", "b"], ["ab"]),
            # Not Identity: a request's specialised plan reads an Identity's input itself.
            oh.make_node("Concat", ["ab", "a"], ["y"], axis=0),
        ],
        [oh.make_tensor_value_info(n, TP.STRING, [2]) for n in ("a", "b")],
        [oh.make_tensor_value_info("y", TP.STRING, [4])],
        opsets={"": 20},
    )
    compiled = ai.Core().compile_model(model, "CPU", {"PERF_COUNT": True})
    request = compiled.create_infer_request()
    a = np.array(["x", "y"], dtype=object)
    b = np.array(["1", "2"], dtype=object)
    assert request.infer_sync([a, b])["y"].tolist() == ["x1", "y2", "x", "y"]
    nodes = [e for e in request.get_profiling_info() if e["type"] == "node"]
    kinds = {e["op_type"]: e["execution_type"] for e in nodes}
    assert kinds == {"StringConcat": "fallback", "Concat": "native"}


def test_native_kernels_win_over_fallbacks() -> None:
    """For one version a native entry wins whatever the registration order; a fallback
    registered from an older version still covers the versions before the native one."""
    key = ("test.aioinfer", "Twice")
    native = lambda spec: lambda x: (x,)  # noqa: E731
    fallback = lambda spec: lambda x: (x,)  # noqa: E731
    try:
        registry.kernel("Twice", since=3, domain="test.aioinfer")(native)
        registry.kernel("Twice", since=3, domain="test.aioinfer", execution_type="fallback")(
            fallback
        )
        registry.kernel("Twice", since=1, domain="test.aioinfer", execution_type="fallback")(
            fallback
        )
        assert registry.find_kernel("test.aioinfer", "Twice", 5).factory is native
        assert registry.find_kernel("test.aioinfer", "Twice", 2).factory is fallback
    finally:
        registry._REGISTRY.pop(key)


def test_fallback_operators_are_registered_as_fallback() -> None:
    operators = registry.registered_operators()
    for domain, op_type in FALLBACK_OPERATORS:
        kinds = {e.execution_type for e in operators[(domain, op_type)]}
        assert kinds == {"fallback"}, (domain, op_type, kinds)


def test_fallback_rejects_attributes_at_compile_time() -> None:
    node = oh.make_node("StringNormalizer", ["x"], ["y"], case_change_action="LOWER")
    node.attribute.append(oh.make_attribute("not_an_attribute", 1))
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", TP.STRING, [1])],
        [oh.make_tensor_value_info("y", TP.STRING, [1])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    # An onnx_ir model skips ONNX's checker, so the kernel factory sees the attribute.
    with pytest.raises(
        ai.CompileError, match=r"StringNormalizer version 10 has no attribute\(s\) not_an_attribute"
    ):
        ai.Core().compile_model(ir.serde.deserialize_model(model))
