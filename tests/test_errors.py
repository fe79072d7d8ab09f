"""Bad input raises the specific aioinfer error, named clearly, and nothing is lost.

Each case asserts the exception class and the parts of the message a user needs (the
input's name, what was expected, what was given); after an inference-time error the
same request runs correctly with good input.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import aioinfer
from tests.helpers import (
    make_model,
    mlp_model,
    reference_outputs,
    reshape_model,
    tensor_info,
    two_input_model,
)

pytestmark = pytest.mark.anyio

RTOL = 1e-5
ATOL = 1e-6


@pytest.fixture
def core() -> aioinfer.Core:
    return aioinfer.Core()


def good_two_inputs(rows: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {
        "a": rng.standard_normal((rows, 3)).astype(np.float32),
        "b": rng.standard_normal((rows, 3)).astype(np.float32),
        "scale": np.array([2, -1, 3], np.int64),
    }


async def assert_still_works(request: aioinfer.InferRequest, proto: onnx.ModelProto) -> None:
    """The request runs ``proto`` correctly after an error (async and sync path)."""
    feeds = good_two_inputs(rows=4)
    want = reference_outputs(proto, feeds)
    for results in (await request.infer(feeds), request.infer_sync(feeds)):
        np.testing.assert_allclose(results["out"], want[0], rtol=RTOL, atol=ATOL)


# -- reading models ---------------------------------------------------------------------


def test_missing_file(core: aioinfer.Core, tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "model.onnx"
    with pytest.raises(aioinfer.ModelNotFoundError, match=r"model file not found.*nowhere"):
        core.read_model(path)
    with pytest.raises(FileNotFoundError):  # also the builtin's subclass
        core.compile_model(str(path))


def test_directory_is_not_a_model(core: aioinfer.Core, tmp_path: Path) -> None:
    with pytest.raises(aioinfer.InvalidModelError, match="directory"):
        core.read_model(tmp_path)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(np.random.default_rng(0).bytes(512), id="random-bytes"),
        pytest.param(b"name,value\nalpha,1\nbeta,2\n", id="csv-text"),
        pytest.param(b"\x08\x07", id="ir-version-only"),
    ],
)
def test_not_an_onnx_model(core: aioinfer.Core, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(aioinfer.InvalidModelError, match=r"model\.onnx"):
        core.read_model(path)
    with pytest.raises(aioinfer.InvalidModelError, match="bytes"):
        core.read_model(content)


def test_truncated_model_file(core: aioinfer.Core, tmp_path: Path) -> None:
    data = mlp_model(in_features=16, out_features=8).SerializeToString()
    cuts = sorted({1, 2, 5, 10, 17, 50, 100, len(data) // 3, len(data) // 2, len(data) - 1})
    cuts += list(range(len(data) - 40, len(data)))
    raised = 0
    for cut in cuts:
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        # Some prefixes can still parse as a (smaller) valid model; never another error.
        try:
            model = core.read_model(path)
        except aioinfer.InvalidModelError as exc:
            assert f"cut{cut}.onnx" in str(exc)
            raised += 1
        else:
            assert isinstance(model, aioinfer.Model)
    assert raised > len(cuts) // 2


def test_invalid_graph(core: aioinfer.Core) -> None:
    proto = make_model(
        [oh.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
    )
    proto.graph.node[0].input[0] = "undefined_value"
    with pytest.raises(aioinfer.InvalidModelError, match="undefined_value"):
        core.read_model(proto)
    with pytest.raises(aioinfer.InvalidModelError, match="not a valid ONNX model"):
        core.compile_model(proto.SerializeToString())


def test_model_read_errors_share_a_base(core: aioinfer.Core, tmp_path: Path) -> None:
    for source in (tmp_path / "missing.onnx", b"garbage"):
        with pytest.raises(aioinfer.ModelReadError):
            core.read_model(source)


# -- compiling --------------------------------------------------------------------------


def unknown_op_model(domain: str) -> onnx.ModelProto:
    node = oh.make_node("FrobnicateTensor", ["x"], ["y"], name="frob_node", domain=domain)
    graph = oh.make_graph(
        [node],
        "unknown_op",
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
    )
    imports = [oh.make_opsetid("", 18)] + ([oh.make_opsetid(domain, 3)] if domain else [])
    return oh.make_model(graph, opset_imports=imports)


async def test_unsupported_operator_in_custom_domain(core: aioinfer.Core) -> None:
    proto = unknown_op_model("com.example")
    with pytest.raises(aioinfer.UnsupportedOperatorError) as info:
        core.compile_model(proto, "CPU")
    message = str(info.value)
    for part in ("FrobnicateTensor", "com.example", "version 3", "'frob_node'"):
        assert part in message
    with pytest.raises(aioinfer.UnsupportedOperatorError, match="FrobnicateTensor"):
        await core.compile_model_async(proto)  # AUTO: no device has it
    assert isinstance(info.value, aioinfer.CompileError)


def test_unsupported_operator_in_the_default_domain(core: aioinfer.Core) -> None:
    proto = unknown_op_model("")
    # ONNX's checker already rejects an operator ai.onnx does not define.
    with pytest.raises(aioinfer.InvalidModelError, match="FrobnicateTensor"):
        core.read_model(proto)
    # An IR model is taken as is; compiling it names the operator, version and node.
    with pytest.raises(aioinfer.UnsupportedOperatorError) as info:
        core.compile_model(ir.serde.deserialize_model(proto), "CPU")
    message = str(info.value)
    for part in ("ai.onnx::FrobnicateTensor", "version 18", "'frob_node'"):
        assert part in message


@pytest.mark.parametrize(
    ("config", "parts"),
    [
        ({"PERFORMANCE_HINT": "FASTEST"}, ["PERFORMANCE_HINT", "'FASTEST'", "LATENCY"]),
        ({"PERFORMANCE_HINT": 3}, ["PERFORMANCE_HINT", "3", "THROUGHPUT"]),
        ({"NUM_STREAMS": 0}, ["NUM_STREAMS", "0", "positive"]),
        ({"NUM_STREAMS": -2}, ["NUM_STREAMS", "-2"]),
        ({"NUM_STREAMS": "many"}, ["NUM_STREAMS", "'many'", "integer"]),
        ({"NUM_STREAMS": True}, ["NUM_STREAMS", "True", "bool"]),
        ({"INFERENCE_NUM_THREADS": -1}, ["INFERENCE_NUM_THREADS", "-1", ">= 0"]),
        ({"INFERENCE_NUM_THREADS": 1.5j}, ["INFERENCE_NUM_THREADS", "1.5j"]),
    ],
)
def test_bad_property_value(core: aioinfer.Core, config: dict[str, Any], parts: list[str]) -> None:
    with pytest.raises(aioinfer.InvalidPropertyValueError) as info:
        core.compile_model(two_input_model(), "CPU", config)
    for part in parts:
        assert part in str(info.value)


@pytest.mark.parametrize(
    "name",
    ["NETWORK_NAME", "OPTIMAL_NUMBER_OF_INFER_REQUESTS", "SUPPORTED_PROPERTIES", "NUM_CORES"],
)
def test_read_only_property_in_config(core: aioinfer.Core, name: str) -> None:
    with pytest.raises(aioinfer.ReadOnlyPropertyError, match=f"'{name}'.*read-only"):
        core.compile_model(two_input_model(), "CPU", {name: 1})


def test_core_and_compiled_model_stay_usable_after_compile_errors(core: aioinfer.Core) -> None:
    for bad in ({"NUM_STREAMS": 0}, {"NETWORK_NAME": "x"}, {"NOT_A_PROPERTY": 1}):
        with pytest.raises(aioinfer.PropertyError):
            core.compile_model(two_input_model(), "CPU", bad)
    compiled = core.compile_model(two_input_model(), "CPU", {"NUM_STREAMS": 1})
    feeds = good_two_inputs()
    results = compiled.create_infer_request().infer_sync(feeds)
    want = reference_outputs(two_input_model(), feeds)
    np.testing.assert_allclose(results["out"], want[0], rtol=RTOL, atol=ATOL)


# -- inference --------------------------------------------------------------------------

BadCall = Callable[[aioinfer.InferRequest], Any]
"""Something done to a request with bad input (returns an awaitable for infer)."""


def bad_inputs(**changes: Any) -> dict[str, Any]:
    feeds: dict[str, Any] = dict(good_two_inputs())
    feeds.update(changes)
    return {k: v for k, v in feeds.items() if v is not None}


F32_2x3 = np.zeros((2, 3), np.float32)

INPUT_ERRORS: list[Any] = [
    pytest.param(
        bad_inputs(c=F32_2x3),
        aioinfer.UnknownInputError,
        ["'c'", "'a', 'b', 'scale'"],
        id="unknown-name",
    ),
    pytest.param({7: F32_2x3}, aioinfer.UnknownInputError, ["3 inputs", "7"], id="bad-index"),
    pytest.param(
        bad_inputs(a=F32_2x3.astype(np.float64)),
        aioinfer.InputTypeError,
        ["'a'", "float32", "float64"],
        id="float64-for-float32",
    ),
    pytest.param(
        bad_inputs(scale=np.array([1, 2, 3], np.int32)),
        aioinfer.InputTypeError,
        ["'scale'", "int64", "int32"],
        id="int32-for-int64",
    ),
    pytest.param(
        bad_inputs(scale=[0.5, 1.0, 2.0]),
        aioinfer.InputTypeError,
        ["'scale'", "int64", "float64"],
        id="float-list-for-int64",
    ),
    pytest.param(
        bad_inputs(b=np.zeros(3, np.float32)),
        aioinfer.InputShapeError,
        ["'b'", "rank 2", "[N, 3]", "[3]"],
        id="rank-too-low",
    ),
    pytest.param(
        bad_inputs(a=np.zeros((1, 2, 3), np.float32)),
        aioinfer.InputShapeError,
        ["'a'", "rank 2", "[1, 2, 3]"],
        id="rank-too-high",
    ),
    pytest.param(
        bad_inputs(a=np.zeros((2, 4), np.float32)),
        aioinfer.InputShapeError,
        ["'a'", "[N, 3]", "[2, 4]", "dimension 1 is 4, expected 3"],
        id="static-dim",
    ),
    pytest.param(
        bad_inputs(scale=np.array(3, np.int64)),
        aioinfer.InputShapeError,
        ["'scale'", "rank 1", "[]"],
        id="scalar-for-vector",
    ),
    pytest.param(
        bad_inputs(b=None),
        aioinfer.MissingInputError,
        ["'b'"],
        id="missing-input",
    ),
    pytest.param(
        bad_inputs(b=np.zeros((5, 3), np.float32)),
        aioinfer.InputShapeError,
        ["'b'", "'a'", "'N'", "5", "2"],
        id="symbolic-dim-disagrees",
    ),
]


@pytest.mark.parametrize(("feeds", "error", "parts"), INPUT_ERRORS)
async def test_bad_input_then_good_input(
    core: aioinfer.Core, feeds: dict[Any, Any], error: type[Exception], parts: list[str]
) -> None:
    proto = two_input_model()
    compiled = core.compile_model(proto)
    request = compiled.create_infer_request()
    with pytest.raises(error) as info:
        await request.infer(feeds)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))
    assert isinstance(info.value, aioinfer.InputError)
    assert request.results is None  # nothing ran
    await assert_still_works(request, proto)
    other = compiled.create_infer_request()
    with pytest.raises(error):  # the sync path checks the same
        other.infer_sync(feeds)
    await assert_still_works(other, proto)


async def test_bad_input_keeps_the_tensor_set_before(core: aioinfer.Core) -> None:
    proto = two_input_model()
    request = core.compile_model(proto).create_infer_request()
    feeds = good_two_inputs()
    for name, value in feeds.items():
        request.set_tensor(name, value)
    with pytest.raises(aioinfer.InputTypeError, match="'a'"):
        request.set_tensor("a", feeds["a"].astype(np.float16))
    with pytest.raises(aioinfer.InputShapeError, match="'a'"):
        request.set_tensor(0, feeds["a"][None])
    np.testing.assert_array_equal(request.get_tensor("a"), feeds["a"])  # the copy kept
    results = await request.infer()
    np.testing.assert_allclose(
        results["out"], reference_outputs(proto, feeds)[0], rtol=RTOL, atol=ATOL
    )


async def test_missing_input_on_a_fresh_request_names_all(core: aioinfer.Core) -> None:
    request = core.compile_model(two_input_model()).create_infer_request()
    with pytest.raises(aioinfer.MissingInputError, match="'a', 'b', 'scale'"):
        await request.infer()
    request.set_tensor("scale", np.ones(3, np.int64))
    with pytest.raises(aioinfer.MissingInputError) as info:
        request.infer_sync()
    assert "'a'" in str(info.value) and "'b'" in str(info.value)
    assert "'scale'" not in str(info.value)


async def test_too_many_positional_inputs(core: aioinfer.Core) -> None:
    proto = two_input_model()
    request = core.compile_model(proto).create_infer_request()
    feeds = list(good_two_inputs().values())
    with pytest.raises(aioinfer.InputError, match=r"4 inputs given by position.* 3"):
        await request.infer([*feeds, feeds[0]])
    await assert_still_works(request, proto)


@pytest.mark.parametrize(
    ("call", "error", "parts"),
    [
        (lambda r: r.set_tensor("nope", F32_2x3), aioinfer.UnknownInputError, ["'nope'", "'a'"]),
        (lambda r: r.set_tensors("a", []), aioinfer.InputShapeError, ["'a'", "at least one"]),
        (
            lambda r: r.set_tensors("a", [np.zeros((1, 3), np.float32), F32_2x3[:, :2]]),
            aioinfer.InputShapeError,
            ["'a'", "dimension 1 is 2, expected 3"],
        ),
        (
            lambda r: r.set_tensors("a", [np.zeros((1, 3), np.float64)]),
            aioinfer.InputTypeError,
            ["'a'", "float64"],
        ),
        (lambda r: r.get_tensor("nope"), aioinfer.UnknownInputError, ["'nope'", "'out'"]),
        (lambda r: r.get_tensor("out"), aioinfer.MissingInputError, ["'out'", "not computed"]),
    ],
)
async def test_bad_tensor_calls(
    core: aioinfer.Core, call: BadCall, error: type[Exception], parts: list[str]
) -> None:
    proto = two_input_model()
    request = core.compile_model(proto).create_infer_request()
    with pytest.raises(error) as info:
        call(request)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))
    await assert_still_works(request, proto)


async def test_kernel_failure_names_the_node_and_the_request_recovers(
    core: aioinfer.Core,
) -> None:
    proto = reshape_model()
    request = core.compile_model(proto).create_infer_request()
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(aioinfer.InferenceError, match=r"'reshape_node'.*Reshape"):
        await request.infer({"x": x, "shape": np.array([4, 2], np.int64)})
    with pytest.raises(aioinfer.InferenceError, match="'reshape_node'"):
        request.infer_sync({"x": x, "shape": np.array([5, 5], np.int64)})
    results = await request.infer({"x": x, "shape": np.array([3, 2], np.int64)})
    np.testing.assert_array_equal(results["y"], x.reshape(3, 2))
    results = request.infer_sync({"shape": np.array([2, -1], np.int64)})
    np.testing.assert_array_equal(results["y"], x.reshape(2, 3))


async def test_errors_do_not_disturb_other_requests(core: aioinfer.Core) -> None:
    proto = mlp_model()
    compiled = core.compile_model(proto)
    good, bad = compiled.create_infer_request(), compiled.create_infer_request()
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    good.set_tensor("x", x)
    with pytest.raises(aioinfer.InputShapeError):
        await bad.infer({"x": x.T})
    results = await good.infer()
    want = reference_outputs(proto, {"x": x})
    np.testing.assert_allclose(results["y"], want[0], rtol=RTOL, atol=ATOL)
