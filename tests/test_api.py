"""The foundation API: read_model, ports, compile_model, infer, tensors, results, properties.

Numbers are compared with onnxruntime (float32: rtol 1e-5, atol 1e-6).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import aioinfer
from aioinfer.properties import num_cores
from tests.helpers import (
    make_model,
    mlp_model,
    reference_outputs,
    tensor_info,
    two_input_model,
)

pytestmark = pytest.mark.anyio

RTOL = 1e-5
ATOL = 1e-6


@pytest.fixture
def core() -> aioinfer.Core:
    return aioinfer.Core()


@pytest.fixture
def mlp() -> onnx.ModelProto:
    return mlp_model()


@pytest.fixture
def compiled(core: aioinfer.Core, mlp: onnx.ModelProto) -> aioinfer.CompiledModel:
    return core.compile_model(mlp, "CPU")


def batch(rows: int, seed: int, features: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, features)).astype(np.float32)


def assert_matches(results: aioinfer.InferResults, expected: list[np.ndarray]) -> None:
    """``results`` hold ``expected`` in output order: same dtype, shape, values."""
    assert len(results) == len(expected)
    for got, want in zip(results.to_tuple(), expected, strict=True):
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# -- reading models ---------------------------------------------------------------------


def model_sources(tmp_path: Path, proto: onnx.ModelProto) -> dict[str, object]:
    path = tmp_path / "mlp.onnx"
    onnx.save_model(proto, path)
    data = proto.SerializeToString()
    return {
        "str path": str(path),
        "Path": path,
        "bytes": data,
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "ModelProto": proto,
        "onnx_ir.Model": ir.serde.deserialize_model(proto),
    }


@pytest.mark.parametrize(
    "kind",
    ["str path", "Path", "bytes", "bytearray", "memoryview", "ModelProto", "onnx_ir.Model"],
)
async def test_read_model_from_each_source_runs(
    core: aioinfer.Core, mlp: onnx.ModelProto, tmp_path: Path, kind: str
) -> None:
    model = core.read_model(model_sources(tmp_path, mlp)[kind])
    assert isinstance(model, aioinfer.Model)
    assert model.name == "mlp"
    assert [p.name for p in model.inputs] == ["x"]
    assert [p.name for p in model.outputs] == ["y", "z"]
    x = batch(3, seed=1)
    results = await core.compile_model(model).create_infer_request().infer({"x": x})
    assert_matches(results, reference_outputs(mlp, {"x": x}))


async def test_read_model_async(core: aioinfer.Core, mlp: onnx.ModelProto) -> None:
    model = await core.read_model_async(mlp.SerializeToString())
    assert [p.name for p in model.outputs] == ["y", "z"]


def test_read_model_rejects_other_types(core: aioinfer.Core) -> None:
    with pytest.raises(TypeError, match="int"):
        core.read_model(42)  # type: ignore[arg-type]


def test_compiling_does_not_change_the_model(core: aioinfer.Core, mlp: onnx.ModelProto) -> None:
    model = core.read_model(mlp)
    nodes_before = [n.op_type for n in model.ir.graph]
    core.compile_model(model)
    assert [n.op_type for n in model.ir.graph] == nodes_before
    assert len(model.ir.graph.initializers) == 3


def external_data_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    return make_model(
        [
            oh.make_node("MatMul", ["x", "w"], ["xw"]),
            oh.make_node("Add", ["xw", "b"], ["y"]),
        ],
        [tensor_info("x", np.float32, ["batch", 16])],
        [tensor_info("y", np.float32, ["batch", 8])],
        {"w": w, "b": b},
        name="external",
    )


async def test_external_data_is_loaded_relative_to_the_model_file(
    core: aioinfer.Core, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proto = external_data_model()
    saved = copy.deepcopy(proto)  # save_model moves the weights out of the proto it is given
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    onnx.save_model(
        saved,
        model_dir / "model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    assert (model_dir / "weights.bin").stat().st_size == (16 * 8 + 8) * 4
    # The weights must be found next to the model, not in the working directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    model = core.read_model(model_dir / "model.onnx")
    x = np.random.default_rng(8).standard_normal((5, 16)).astype(np.float32)
    results = await core.compile_model(model).create_infer_request().infer({"x": x})
    assert_matches(results, reference_outputs(proto, {"x": x}))


# -- ports ------------------------------------------------------------------------------


def ports_model() -> onnx.ModelProto:
    nodes = [
        oh.make_node("Identity", ["x"], ["x_out"]),
        oh.make_node("Identity", ["ids"], ["ids_out"]),
        oh.make_node("Identity", ["flag"], ["flag_out"]),
    ]
    return make_model(
        nodes,
        [
            tensor_info("x", np.float32, ["batch", 3, None]),
            tensor_info("ids", np.int64, [2, "seq"]),
            tensor_info("flag", np.bool_, []),
        ],
        [
            tensor_info("x_out", np.float32, ["batch", 3, None]),
            tensor_info("ids_out", np.int64, [2, "seq"]),
            tensor_info("flag_out", np.bool_, []),
        ],
        {"unused_weight": np.zeros(2, np.float32)},
        name="ports",
    )


def test_ports_expose_name_type_and_partial_shape(core: aioinfer.Core) -> None:
    model = core.read_model(ports_model())
    compiled = core.compile_model(model)
    for ports in (model.inputs, compiled.inputs):
        x, ids, flag = ports
        assert [p.index for p in ports] == [0, 1, 2]
        assert (x.name, x.element_type, x.dtype) == ("x", ir.DataType.FLOAT, np.float32)
        assert x.shape == ("batch", 3, None)
        assert (x.rank, x.is_dynamic) == (3, True)
        assert str(x) == "x: float[batch, 3, ?]"
        assert (ids.dtype, ids.shape, ids.is_dynamic) == (np.int64, (2, "seq"), True)
        assert (flag.dtype, flag.shape, flag.rank, flag.is_dynamic) == (np.bool_, (), 0, False)
    assert [p.name for p in compiled.outputs] == ["x_out", "ids_out", "flag_out"]
    assert compiled.outputs[0].shape == ("batch", 3, None)
    assert model.input("ids") == model.input(1) == model.inputs[1]
    assert compiled.output("flag_out") == compiled.output(-1)
    assert "x: float[batch, 3, ?]" in repr(model)


def test_initializers_listed_as_graph_inputs_are_not_ports(core: aioinfer.Core) -> None:
    proto = ports_model()
    proto.graph.input.append(tensor_info("unused_weight", np.float32, [2]))
    onnx.checker.check_model(proto)
    assert [p.name for p in core.read_model(proto).inputs] == ["x", "ids", "flag"]


def test_port_of_unknown_rank(core: aioinfer.Core) -> None:
    # The ONNX checker insists on a shape field, so an unknown rank only comes from IR.
    ir_model = ir.serde.deserialize_model(ports_model())
    ir_model.graph.inputs[0].shape = None
    port = core.read_model(ir_model).input("x")
    assert (port.shape, port.rank, port.is_dynamic) == (None, None, True)
    assert str(port) == "x: float?"


def test_model_reshape_sets_input_shapes(core: aioinfer.Core, mlp: onnx.ModelProto) -> None:
    model = core.read_model(mlp)
    model.reshape({"x": [2, 4]})
    assert model.input("x").shape == (2, 4)
    compiled = core.compile_model(model)
    assert compiled.input(0).shape == (2, 4)
    with pytest.raises(aioinfer.InputShapeError, match="dimension 0 is 3, expected 2"):
        compiled.create_infer_request().infer_sync([batch(3, seed=0)])


# -- compiling and inferring ------------------------------------------------------------


async def test_compile_model_async(core: aioinfer.Core, mlp: onnx.ModelProto) -> None:
    compiled = await core.compile_model_async(mlp, "CPU")
    assert isinstance(compiled, aioinfer.CompiledModel)
    x = batch(2, seed=3)
    results = await compiled.create_infer_request().infer({"x": x})
    assert_matches(results, reference_outputs(mlp, {"x": x}))


async def test_compile_model_from_path_defaults_to_auto(
    core: aioinfer.Core, mlp: onnx.ModelProto, tmp_path: Path
) -> None:
    onnx.save_model(mlp, tmp_path / "m.onnx")
    compiled = await core.compile_model_async(str(tmp_path / "m.onnx"))
    assert compiled.get_property("DEVICE_NAME") == "AUTO"
    assert compiled.get_property("EXECUTION_DEVICES") == ("ORT",)  # onnxruntime: test extra
    assert "CPU" in core.available_devices


@pytest.mark.parametrize("form", ["dict by name", "dict by index", "dict by port", "list"])
async def test_infer_input_forms(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto, form: str
) -> None:
    x = batch(4, seed=4)
    inputs = {
        "dict by name": {"x": x},
        "dict by index": {0: x},
        "dict by port": {compiled.input("x"): x},
        "list": [x],
    }[form]
    results = await compiled.create_infer_request().infer(inputs)
    assert_matches(results, reference_outputs(mlp, {"x": x}))


async def test_infer_with_several_inputs_as_list() -> None:
    proto = two_input_model()
    compiled = aioinfer.Core().compile_model(proto)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 4, 3)).astype(np.float32)
    scale = np.array([1, -2, 3], np.int64)
    results = await compiled.create_infer_request().infer([a, b, scale])
    assert_matches(results, reference_outputs(proto, {"a": a, "b": b, "scale": scale}))


async def test_results_by_name_index_and_port(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    x = batch(3, seed=6)
    y, z = reference_outputs(mlp, {"x": x})
    request = compiled.create_infer_request()
    assert request.results is None
    results = await request.infer({"x": x})
    for key in ("z", 1, -1, compiled.output("z"), compiled.outputs[1]):
        np.testing.assert_allclose(results[key], z, rtol=RTOL, atol=ATOL)
    assert results["y"] is results[0] is results[compiled.outputs[0]]
    assert list(results) == ["y", "z"]
    assert list(results.to_dict()) == ["y", "z"]
    assert results.to_dict()["y"] is results["y"]
    assert dict(results).keys() == {"y", "z"}
    assert repr(results) == "<InferResults y: float32[3, 3], z: float32[3, 1]>"
    with pytest.raises(aioinfer.UnknownInputError, match="'y', 'z'"):
        results["nope"]
    assert request.results is results
    np.testing.assert_allclose(request.results["y"], y, rtol=RTOL, atol=ATOL)


async def test_request_results_hold_the_last_inference(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    request = compiled.create_infer_request()
    first = await request.infer({"x": batch(2, seed=7)})
    x = batch(5, seed=8)
    second = await request.infer({"x": x})
    assert request.results is second
    assert request.results is not first
    assert_matches(request.results, reference_outputs(mlp, {"x": x}))


async def test_get_and_set_tensor(compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto) -> None:
    request = compiled.create_infer_request()
    x = batch(2, seed=9)
    request.set_tensor("x", x)
    # The request's own copy (shared only on request: see tests/test_input_ownership.py).
    assert not np.shares_memory(request.get_tensor("x"), x)
    np.testing.assert_array_equal(request.get_tensor("x"), x)
    assert request.get_tensor(compiled.input(0)) is request.get_tensor("x")
    results = await request.infer()  # uses the tensor set before
    y, z = reference_outputs(mlp, {"x": x})
    np.testing.assert_allclose(request.get_tensor("y"), y, rtol=RTOL, atol=ATOL)
    assert request.get_tensor("z") is results["z"]
    assert request.get_tensor(compiled.output("z")) is results["z"]

    x2 = batch(3, seed=10)
    request.set_tensor(0, x2)
    np.testing.assert_array_equal(request.get_tensor("x"), x2)
    request.set_tensor(compiled.input("x"), x, share_inputs=True)
    assert request.get_tensor("x") is x
    results = await request.infer()
    np.testing.assert_allclose(results["z"], z, rtol=RTOL, atol=ATOL)


async def test_set_tensor_accepts_array_likes_of_the_same_kind(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    rows = [[1, 2, 3, 4], [-1, 0, 1, 2]]  # ints become float32 without changing their kind
    request = compiled.create_infer_request()
    request.set_tensor("x", rows)
    assert request.get_tensor("x").dtype == np.float32
    results = await request.infer()
    assert_matches(results, reference_outputs(mlp, {"x": np.array(rows, np.float32)}))


@pytest.mark.parametrize("batch_sizes", [[1, 1, 1], [2, 1, 3]])
async def test_set_tensors_equals_one_batched_call(
    compiled: aioinfer.CompiledModel, batch_sizes: list[int]
) -> None:
    parts = [batch(n, seed=20 + i) for i, n in enumerate(batch_sizes)]
    request = compiled.create_infer_request()
    request.set_tensors("x", parts)
    np.testing.assert_array_equal(request.get_tensor("x"), np.concatenate(parts))
    joined = await request.infer()
    whole = await compiled.create_infer_request().infer({"x": np.concatenate(parts)})
    for name in ("y", "z"):
        np.testing.assert_array_equal(joined[name], whole[name])
    assert joined["y"].shape == (sum(batch_sizes), 3)


async def test_set_tensors_fills_a_static_batch(core: aioinfer.Core, mlp: onnx.ModelProto) -> None:
    model = core.read_model(mlp)
    model.reshape({"x": [3, 4]})
    compiled = core.compile_model(model)
    parts = [batch(1, seed=30 + i) for i in range(3)]
    request = compiled.create_infer_request()
    request.set_tensors(compiled.input(0), parts)
    results = await request.infer()
    assert_matches(results, reference_outputs(mlp, {"x": np.concatenate(parts)}))


async def test_infer_sync_equals_infer(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    x = batch(4, seed=11)
    asynchronous = await compiled.create_infer_request().infer({"x": x})
    request = compiled.create_infer_request()
    synchronous = request.infer_sync({"x": x})
    assert request.results is synchronous
    for name in ("y", "z"):
        np.testing.assert_array_equal(synchronous[name], asynchronous[name])
    assert_matches(synchronous, reference_outputs(mlp, {"x": x}))


async def test_one_request_reused_with_different_inputs(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    request = compiled.create_infer_request()
    for step, rows in enumerate([1, 4, 2, 7, 1, 3]):
        x = batch(rows, seed=100 + step)
        if step % 2:
            results = request.infer_sync([x])
        else:
            results = await request.infer({"x": x})
        assert_matches(results, reference_outputs(mlp, {"x": x}))


async def test_requests_of_one_compiled_model_are_independent(
    compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    first, second = compiled.create_infer_request(), compiled.create_infer_request()
    x1, x2 = batch(2, seed=12), batch(3, seed=13)
    first.set_tensor("x", x1)
    second.set_tensor("x", x2)
    r2 = await second.infer()
    r1 = await first.infer()
    assert_matches(r1, reference_outputs(mlp, {"x": x1}))
    assert_matches(r2, reference_outputs(mlp, {"x": x2}))


# -- results belong to the caller -------------------------------------------------------


async def test_results_are_fresh_arrays(compiled: aioinfer.CompiledModel) -> None:
    request = compiled.create_infer_request()
    x1 = batch(2, seed=14)
    first = await request.infer({"x": x1})
    kept = {name: first[name].copy() for name in first}
    for name in first:
        assert first[name].flags.writeable
        first[name][...] = 123.0  # the caller owns these arrays
    second = await request.infer({"x": x1})
    for name in second:
        np.testing.assert_array_equal(second[name], kept[name])
        assert not np.shares_memory(second[name], first[name])
    third = await request.infer({"x": batch(2, seed=15)})
    for name in first:
        np.testing.assert_array_equal(first[name], 123.0)  # a later run leaves it alone
        np.testing.assert_array_equal(second[name], kept[name])
        assert not np.shares_memory(third[name], second[name])


def aliasing_model() -> onnx.ModelProto:
    """Outputs that are a graph input, an initializer, a view of an input, and a folded
    constant."""
    nodes = [
        oh.make_node("Identity", ["x"], ["x_identity"]),
        oh.make_node("Reshape", ["x", "flat"], ["x_flat"]),
        oh.make_node("Add", ["w", "w"], ["w_twice"]),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 3])],
        [
            tensor_info("x", np.float32, [2, 3]),
            tensor_info("w", np.float32, [2, 3]),
            tensor_info("x_identity", np.float32, [2, 3]),
            tensor_info("x_flat", np.float32, [6]),
            tensor_info("w_twice", np.float32, [2, 3]),
        ],
        {
            "w": np.arange(6, dtype=np.float32).reshape(2, 3),
            "flat": np.array([6], np.int64),
        },
        name="aliasing",
    )


async def test_outputs_aliasing_inputs_or_weights_are_copies(core: aioinfer.Core) -> None:
    compiled = core.compile_model(aliasing_model())
    request = compiled.create_infer_request()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    x_before = x.copy()
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = {"x": x_before, "w": w, "x_identity": x_before, "x_flat": x_before.ravel()}
    expected["w_twice"] = 2 * w
    results = await request.infer({"x": x})
    assert list(results) == ["x", "w", "x_identity", "x_flat", "w_twice"]
    for name, want in expected.items():
        got = results[name]
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert got.dtype == np.float32
        assert got is not x
        assert not np.shares_memory(got, x), name
        assert got.flags.writeable, name
        got[...] = -7.0
    np.testing.assert_array_equal(x, x_before)  # the user's input is untouched
    again = await request.infer({"x": x})
    for name, want in expected.items():
        np.testing.assert_array_equal(again[name], want, err_msg=name)
    # Another request sees the weights unchanged too.
    other = await compiled.create_infer_request().infer({"x": x})
    np.testing.assert_array_equal(other["w"], w)


# -- properties, devices, query ---------------------------------------------------------


def test_read_only_properties(compiled: aioinfer.CompiledModel) -> None:
    assert compiled.get_property("NETWORK_NAME") == "mlp"
    assert compiled.name == "mlp"
    assert compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 1
    assert compiled.get_property("PERFORMANCE_HINT") == "LATENCY"
    assert compiled.get_property("DEVICE_NAME") == "CPU"
    assert compiled.get_property("NUM_CORES") == num_cores()
    supported = compiled.get_property("SUPPORTED_PROPERTIES")
    for name in (
        "NETWORK_NAME",
        "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
        "SUPPORTED_PROPERTIES",
        "PERFORMANCE_HINT",
        "NUM_STREAMS",
        "INFERENCE_NUM_THREADS",
    ):
        assert name in supported
        compiled.get_property(name)  # each listed property can be read


@pytest.mark.parametrize(
    ("config", "streams"),
    [
        ({}, 1),
        ({"PERFORMANCE_HINT": "LATENCY"}, 1),
        ({"PERFORMANCE_HINT": "THROUGHPUT"}, num_cores()),
        ({"PERFORMANCE_HINT": "throughput"}, num_cores()),
        ({"NUM_STREAMS": 3}, 3),
        ({"NUM_STREAMS": "2", "PERFORMANCE_HINT": "THROUGHPUT"}, 2),
    ],
)
def test_config_sets_streams(
    core: aioinfer.Core, mlp: onnx.ModelProto, config: dict[str, object], streams: int
) -> None:
    compiled = core.compile_model(mlp, "CPU", config)
    assert compiled.get_property("NUM_STREAMS") == streams
    optimal = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    hint = str(config.get("PERFORMANCE_HINT", "LATENCY")).upper()
    assert compiled.get_property("PERFORMANCE_HINT") == hint
    # LATENCY: one request per stream; THROUGHPUT may ask for more to keep streams fed.
    assert optimal == streams if hint == "LATENCY" else optimal >= streams


def test_device_properties(core: aioinfer.Core) -> None:
    supported = core.get_property("CPU", "SUPPORTED_PROPERTIES")
    assert "PERFORMANCE_HINT" in supported and "NETWORK_NAME" in supported
    assert core.get_property("CPU", "DEVICE_NAME") == "CPU"
    assert core.get_property("CPU", "NUM_CORES") == num_cores() >= 1


def test_unknown_device_lists_available(core: aioinfer.Core, mlp: onnx.ModelProto) -> None:
    with pytest.raises(aioinfer.UnknownDeviceError, match=r"'GPU'.*available: .*CPU"):
        core.compile_model(mlp, "GPU")
    with pytest.raises(aioinfer.UnknownDeviceError, match="CPU"):
        core.get_property("NPU", "DEVICE_NAME")


def test_unknown_property_lists_supported(
    core: aioinfer.Core, compiled: aioinfer.CompiledModel, mlp: onnx.ModelProto
) -> None:
    with pytest.raises(aioinfer.UnknownPropertyError) as info:
        compiled.get_property("BATCH_SIZE")
    message = str(info.value)
    assert "'BATCH_SIZE'" in message
    for name in ("NETWORK_NAME", "OPTIMAL_NUMBER_OF_INFER_REQUESTS", "PERFORMANCE_HINT"):
        assert name in message
    with pytest.raises(aioinfer.UnknownPropertyError, match=r"'MODEL_PRIORITY'.*PERFORMANCE_HINT"):
        core.compile_model(mlp, "CPU", {"MODEL_PRIORITY": "HIGH"})
    with pytest.raises(aioinfer.UnknownPropertyError, match=r"'FOO'.*SUPPORTED_PROPERTIES"):
        core.get_property("CPU", "FOO")
    assert isinstance(info.value, aioinfer.PropertyError)


def test_query_model_lists_the_nodes_the_device_runs(
    core: aioinfer.Core, mlp: onnx.ModelProto
) -> None:
    assert core.query_model(mlp, "CPU") == {
        "matmul": "CPU",
        "add": "CPU",
        "relu": "CPU",
        "sum": "CPU",
    }
    proto = make_model(
        [
            oh.make_node("Abs", ["x"], ["a"], name="abs"),
            oh.make_node("Mystery", ["a"], ["y"], name="mystery", domain="com.example"),
        ],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
        opsets={"": 18, "com.example": 1},
    )
    assert core.query_model(core.read_model(proto), "CPU") == {"abs": "CPU"}
    assert core.query_model(core.read_model(proto)) == {"abs": "ORT"}  # AUTO: the first


def test_aioinfer_errors_share_one_base() -> None:
    for name in aioinfer.__all__:
        obj = getattr(aioinfer, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, aioinfer.AioinferError), name
