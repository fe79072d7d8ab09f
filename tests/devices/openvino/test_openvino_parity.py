"""What code ported from OpenVINO's Python API reaches for first, as OpenVINO's own Python
tests exercise it: streams in read_model / import_model, a callable compiled model, Core
properties (CACHE_DIR for every device, settings per device), the device list and versions,
the module-level compile_model, release_memory, iterating an AsyncInferQueue and
get_idle_request_id, FULL_DEVICE_NAME. See docs/coming-from-openvino.md.

Numbers are compared with onnxruntime (float32: rtol 1e-5, atol 1e-6).
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import pytest

import aioinfer as ai
from aioinfer.testing.models import accumulator_model, scaled_model, two_input_model
from tests.helpers import chain_model, mlp_model, reference_outputs

pytestmark = pytest.mark.anyio

RTOL = 1e-5
ATOL = 1e-6
MLP = mlp_model()
X = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
CHAIN = chain_model(steps=4, width=8)
"""A model with planned activation buffers (MLP has none: its values are outputs)."""
CHAIN_X = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)


def _assert_mlp_results(results: ai.InferResults, x: np.ndarray = X) -> None:
    expected = reference_outputs(MLP, {"x": x})
    assert len(results) == len(expected)
    for got, want in zip(results.to_tuple(), expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def _run(compiled: ai.CompiledModel, x: np.ndarray = X) -> ai.InferResults:
    return compiled.create_infer_request().infer_sync({"x": x})


def _openvino() -> Any:
    """The ``openvino`` module when it is installed (to run the same calls side by
    side), else None."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino


# -- export into a stream, import from it; read_model from file objects ---------------------


def test_import_from_the_stream_export_just_wrote() -> None:
    core = ai.Core()
    compiled = core.compile_model(MLP, "CPU")
    stream = io.BytesIO()
    blob = compiled.export_model(stream)  # leaves the stream at its end, as OpenVINO's does
    imported = core.import_model(stream, "CPU")
    _assert_mlp_results(_run(imported))
    # A stream with something left to read is read from where it is: a blob stored after
    # data of the application's own is found (OpenVINO always rewinds).
    header = b"the application's own header"
    stored = io.BytesIO(header + blob)
    stored.seek(len(header))
    _assert_mlp_results(_run(core.import_model(stored, "CPU")))


async def test_import_model_async_from_a_written_stream() -> None:
    core = ai.Core()
    stream = io.BytesIO()
    core.compile_model(MLP, "CPU").export_model(stream)
    imported = await core.import_model_async(stream, "CPU")
    _assert_mlp_results(await imported.infer({"x": X}))


def _saved(tmp_path: Path, external: bool = False) -> Path:
    path = tmp_path / "mlp.onnx"
    if external:
        onnx.save_model(  # on a copy: saving moves the weights out of the proto
            copy.deepcopy(MLP),
            path,
            save_as_external_data=True,
            location="mlp.weights",
            size_threshold=0,
        )
        assert (tmp_path / "mlp.weights").stat().st_size > 0
    else:
        onnx.save_model(MLP, path)
    return path


@pytest.mark.parametrize("kind", ["BytesIO at 0", "BytesIO just written", "open file"])
def test_read_model_from_a_file_object(tmp_path: Path, kind: str) -> None:
    if kind == "open file":
        source: io.BufferedIOBase = _saved(tmp_path).open("rb")
    else:
        source = io.BytesIO()
        onnx.save_model(MLP, source)  # the stream is now at its end
        if kind == "BytesIO at 0":
            source.seek(0)
    with source:
        model = ai.Core().read_model(source)
    assert model.name == "mlp"
    _assert_mlp_results(_run(ai.Core().compile_model(model)))


def test_read_model_from_an_open_file_finds_its_external_data(tmp_path: Path) -> None:
    path = _saved(tmp_path, external=True)
    with path.open("rb") as source:
        compiled = ai.Core().compile_model(source)
    _assert_mlp_results(_run(compiled))


async def test_read_model_async_from_a_file_object() -> None:
    stream = io.BytesIO(MLP.SerializeToString())
    model = await ai.Core().read_model_async(stream)
    assert [p.name for p in model.outputs] == ["y", "z"]


def test_read_model_refuses_a_text_stream(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with path.open("r", encoding="latin-1") as text, pytest.raises(TypeError, match="'rb'"):
        ai.Core().read_model(text)  # type: ignore[arg-type]


# -- a callable compiled model ----------------------------------------------------------------


async def test_compiled_model_is_callable() -> None:
    compiled = ai.Core().compile_model(MLP, "CPU")
    results = await compiled({"x": X})
    _assert_mlp_results(results)
    _assert_mlp_results(await compiled([X]))  # by position, as infer takes them
    again = await compiled.infer({"x": X})
    for got, want in zip(results.to_tuple(), again.to_tuple(), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ai.MissingInputError):
        await compiled({})


def test_compact_compile_and_call_on_a_path(tmp_path: Path) -> None:
    """``ov.compile_model(path)(inputs)``: here the call is awaited (in a script, under
    ``anyio.run``); the default device (AUTO) chooses as OpenVINO's AUTO does."""
    path = _saved(tmp_path)

    async def compact() -> list[ai.InferResults]:
        return [
            await ai.compile_model(str(path))([X]),
            await ai.compile_model(path)({"x": X}),
            await ai.compile_model(path, "CPU")((X,)),
        ]

    for results in anyio.run(compact):
        _assert_mlp_results(results)
    ov = _openvino()
    if ov is not None:
        theirs = ov.compile_model(str(path))([X])
        for got, want in zip(anyio.run(compact)[0].to_tuple(), theirs.to_tuple(), strict=True):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# -- input forms: by position, scalars, a mix of both -------------------------------------------

SCALED = scaled_model()
SCALED_X = np.arange(6, dtype=np.float32).reshape(3, 2)
OFFSET = np.array([0.5, -1.0], np.float32)


@pytest.mark.parametrize(
    "inputs",
    [
        [SCALED_X, 2.0, OFFSET],
        (SCALED_X, np.float32(2), OFFSET),
        [SCALED_X, np.int32(2), OFFSET],
        [SCALED_X, 2, OFFSET],
        {0: SCALED_X, 1: np.array(2.0, np.float32), 2: OFFSET},
        {"x": SCALED_X, "scale": np.array(2, np.int32), "offset": OFFSET},
        {"x": SCALED_X, "scale": np.array(2.0), "offset": OFFSET},
    ],
    ids=["list", "tuple", "np.int32", "int", "0-d float32", "0-d int32", "0-d float64"],
)
async def test_inputs_by_position_and_scalars_as_openvino_takes_them(inputs: object) -> None:
    compiled = ai.Core().compile_model(SCALED, "CPU")
    results = await compiled.create_infer_request().infer(inputs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(results["y"], SCALED_X * 2 + OFFSET)
    ov = _openvino()
    if ov is not None:
        theirs = ov.Core().compile_model(ov.Core().read_model(SCALED.SerializeToString()))
        np.testing.assert_array_equal(theirs.create_infer_request().infer(inputs)[0], results[0])


async def test_a_string_is_not_the_inputs() -> None:
    """OpenVINO refuses a string given as the inputs (TypeError "Incompatible inputs of
    type" in its tests; on 2026.4.1 ValueError for a model of one input, RuntimeError for
    one of several). Here InputTypeError, both a TypeError and a ValueError, where a
    string was read as inputs by position, one per character."""
    models = {"one input": MLP, "two inputs": two_input_model()}
    for model in models.values():
        compiled = ai.Core().compile_model(model, "CPU")
        with pytest.raises(ai.InputTypeError, match="incompatible inputs of type str") as caught:
            await compiled.create_infer_request().infer("some_input")  # type: ignore[arg-type]
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
        with pytest.raises(ai.InputTypeError, match="incompatible inputs of type str"):
            await compiled("some_input")  # type: ignore[arg-type]
    ov = _openvino()
    if ov is not None:  # its error depends on the model and its version: any refusal
        core = ov.Core()
        for model in models.values():
            theirs = core.compile_model(core.read_model(model.SerializeToString()), "CPU")
            with pytest.raises((TypeError, ValueError, RuntimeError)):
                theirs.create_infer_request().infer("some_input")


# -- variable state ----------------------------------------------------------------------------


async def test_state_written_from_a_new_buffer_reads_back_as_on_openvino() -> None:
    """``state.state = value`` then reading it back, on each side: the value written (a
    copy of the buffer), the next step's start. OpenVINO takes an ``ov.Tensor`` and reads
    back a live view of its state; aioinfer takes and gives numpy arrays, read-only."""
    compiled = ai.Core().compile_model(
        accumulator_model(width=3, rounds=1), "CPU", {"STATEFUL": {"past": "present"}}
    )
    request = compiled.create_infer_request()
    (state,) = request.query_state()
    buffer = np.full((2, 3), 5, np.int64)
    state.state = buffer
    buffer[:] = 100
    ours = [state.state.copy()]
    ours.append((await request.infer({"x": np.ones((2, 3), np.int64)}))["y"])
    ours.append(state.state.copy())
    await compiled.close()
    ov = _openvino()
    if ov is None:
        pytest.skip("OpenVINO is not installed: nothing to compare with")
    import openvino.opset13 as ops
    from openvino.op.util import Variable, VariableInfo

    # The same accumulator in float32: OpenVINO's CPU keeps no int64 state.
    info = VariableInfo()
    info.data_shape, info.data_type, info.variable_id = (
        ov.PartialShape([2, 3]),
        ov.Type.f32,
        "past",
    )
    variable = Variable(info)
    x = ops.parameter([2, 3], dtype=np.float32, name="x")
    total = ops.add(ops.read_value(ops.constant(np.zeros((2, 3), np.float32)), variable), x)
    model = ov.Model(
        results=[ops.result(total)], sinks=[ops.assign(total, variable)], parameters=[x]
    )
    ov_request = ov.Core().compile_model(model, "CPU").create_infer_request()
    (ov_state,) = ov_request.query_state()
    buffer = np.full((2, 3), 5, np.float32)
    ov_state.state = ov.Tensor(buffer)
    buffer[:] = 100
    theirs = [ov_state.state.data.copy()]
    theirs.append(ov_request.infer({"x": np.ones((2, 3), np.float32)})[0])
    theirs.append(ov_state.state.data.copy())
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(got, want)


# -- Core properties --------------------------------------------------------------------------


def test_cache_dir_set_on_the_core_applies_to_later_compiles(tmp_path: Path) -> None:
    core = ai.Core()
    assert core.get_property("CACHE_DIR") == ""
    before = core.compile_model(MLP, "CPU")
    assert before.get_property("LOADED_FROM_CACHE") is False
    cache = tmp_path / "cache"
    core.set_property({"CACHE_DIR": str(cache)})
    assert core.get_property("CACHE_DIR") == str(cache)
    assert core.get_property("CPU", "CACHE_DIR") == str(cache)
    first = core.compile_model(MLP, "CPU")
    assert first.get_property("LOADED_FROM_CACHE") is False
    assert len(list(cache.iterdir())) == 1  # the compiled model was stored
    second = core.compile_model(MLP, "CPU")
    assert second.get_property("LOADED_FROM_CACHE") is True
    _assert_mlp_results(_run(second))
    # The config given to compile_model wins; another Core has its own settings.
    assert (
        core.compile_model(MLP, "CPU", {"CACHE_DIR": ""}).get_property("LOADED_FROM_CACHE") is False
    )
    assert ai.Core().compile_model(MLP, "CPU").get_property("LOADED_FROM_CACHE") is False


def test_cache_dir_set_on_the_core_reaches_the_target_of_a_virtual_device(
    tmp_path: Path,
) -> None:
    core = ai.Core()
    core.set_property({"CACHE_DIR": str(tmp_path)})
    core.compile_model(MLP, "BATCH:CPU")  # BATCH takes no CACHE_DIR; its target does
    assert len(list(tmp_path.iterdir())) == 1
    assert core.compile_model(MLP, "CPU").get_property("LOADED_FROM_CACHE") is True


def test_device_settings_apply_to_later_compiles_on_that_device() -> None:
    core = ai.Core()
    assert core.get_property("CPU", "NUM_STREAMS") == "AUTO"
    core.set_property("CPU", {"NUM_STREAMS": "2", "ALLOW_AUTO_BATCHING": False})
    assert core.get_property("CPU", "NUM_STREAMS") == 2
    assert core.compile_model(MLP, "CPU").get_property("NUM_STREAMS") == 2
    assert core.compile_model(MLP, "CPU", {"NUM_STREAMS": 1}).get_property("NUM_STREAMS") == 1
    # The target of a virtual device gets its own settings.
    batched = core.compile_model(MLP, "BATCH:CPU")
    assert batched.get_property("DEVICE_NAME") == "BATCH:CPU"
    assert batched.get_property("NUM_STREAMS") == 2
    # A setting for every device is overridden by one for the device.
    core.set_property({"NUM_STREAMS": 3, "PERF_COUNT": True})
    compiled = core.compile_model(MLP, "CPU")
    assert compiled.get_property("NUM_STREAMS") == 2
    assert compiled.get_property("PERF_COUNT") is True
    assert ai.Core().compile_model(MLP, "CPU").get_property("NUM_STREAMS") == 1


def test_a_throughput_hint_set_for_the_device_batches_automatically() -> None:
    core = ai.Core()
    core.set_property("CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})
    core.set_property("BATCH", {"MAX_BATCH_SIZE": 4})
    compiled = core.compile_model(MLP, "CPU")
    assert compiled.get_property("DEVICE_NAME") == "BATCH:CPU"
    assert compiled.get_property("MAX_BATCH_SIZE") == 4  # the BATCH device's setting
    assert compiled.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    _assert_mlp_results(_run(compiled))


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (({"NO_SUCH_PROPERTY": 1},), ai.UnknownPropertyError, "NO_SUCH_PROPERTY"),
        (({"NETWORK_NAME": "x"},), ai.ReadOnlyPropertyError, "NETWORK_NAME"),
        (({"PERFORMANCE_HINT": "FASTEST"},), ai.InvalidPropertyValueError, "FASTEST"),
        (("CPU", {"MAX_BATCH_SIZE": 4}), ai.UnknownPropertyError, "MAX_BATCH_SIZE"),
        (("BATCH:CPU", {"MAX_BATCH_SIZE": 4}), ai.UnknownDeviceError, "BATCH:CPU"),
        (("GPU", {"NUM_STREAMS": 2}), ai.UnknownDeviceError, "GPU"),
    ],
)
def test_set_property_refuses_bad_settings_and_keeps_none_of_them(
    args: tuple[object, ...], error: type[Exception], words: str
) -> None:
    core = ai.Core()
    with pytest.raises(error, match=words):
        core.set_property(*args)  # type: ignore[call-overload]
    assert core.get_property("PERFORMANCE_HINT") == "LATENCY"
    assert core.get_property("CPU", "NUM_STREAMS") == "AUTO"
    assert core.compile_model(MLP, "CPU").get_property("NUM_STREAMS") == 1


def test_one_property_set_alone_as_a_pair_reads_back(tmp_path: Path) -> None:
    """OpenVINO's property helpers make ``(name, value)`` pairs that ``set_property``
    takes alone, for a device or for every device; the other settings stay."""
    core = ai.Core()
    core.set_property("CPU", ("NUM_STREAMS", "2"))
    core.set_property("CPU", ("PERF_COUNT", "YES"))
    core.set_property(("CACHE_DIR", str(tmp_path)))
    read = {
        "NUM_STREAMS": core.get_property("CPU", "NUM_STREAMS"),
        "PERF_COUNT": core.get_property("CPU", "PERF_COUNT"),
        "CACHE_DIR": core.get_property("CACHE_DIR"),
        "CPU CACHE_DIR": core.get_property("CPU", "CACHE_DIR"),
    }
    assert read == {
        "NUM_STREAMS": 2,
        "PERF_COUNT": True,
        "CACHE_DIR": str(tmp_path),
        "CPU CACHE_DIR": str(tmp_path),
    }
    compiled = core.compile_model(MLP, "CPU")
    assert compiled.get_property("NUM_STREAMS") == 2
    assert compiled.get_property("PERF_COUNT") is True
    assert len(list(tmp_path.iterdir())) == 1  # the cache was used
    with pytest.raises(TypeError, match=r"\(name, value\) pair"):
        core.set_property("CPU", ("NUM_STREAMS",))  # type: ignore[arg-type]
    with pytest.raises(ai.UnknownPropertyError, match="NO_SUCH"):
        core.set_property("CPU", ("NO_SUCH", 1))
    assert core.get_property("CPU", "NUM_STREAMS") == 2
    ov = _openvino()
    if ov is not None:  # the same calls on OpenVINO read back the same values
        ov_core = ov.Core()
        ov_core.set_property("CPU", ("NUM_STREAMS", "2"))
        ov_core.set_property("CPU", ("PERF_COUNT", "YES"))
        ov_core.set_property(("CACHE_DIR", str(tmp_path / "ov")))
        assert ov_core.get_property("CPU", "NUM_STREAMS") == read["NUM_STREAMS"]
        assert ov_core.get_property("CPU", "PERF_COUNT") is read["PERF_COUNT"]
        assert ov_core.get_property("CACHE_DIR") == str(tmp_path / "ov")


def test_every_writable_property_reads_back_what_was_set() -> None:
    core = ai.Core()
    devices = core.get_available_devices()
    for device in devices:
        for name, declared in core.get_plugin(device).properties.items():
            if declared.configurable:
                value = core.get_property(device, name)
                core.set_property(device, (name, value))
                assert core.get_property(device, name) == value, (device, name)
                core.set_property(device, {name: value})
                assert core.get_property(device, name) == value, (device, name)
    every = {n for d in devices for n, p in core.get_plugin(d).properties.items() if p.configurable}
    for name in sorted(every):
        value = core.get_property(name)
        core.set_property((name, value))
        assert core.get_property(name) == value, name


def test_get_property_refuses_unknown_and_per_model_names() -> None:
    core = ai.Core()
    with pytest.raises(ai.UnknownPropertyError, match="FULL_DEVICE_NAME"):
        core.get_property("FULL_DEVICE_NAME")  # a device property: name the device
    with pytest.raises(ai.UnknownPropertyError, match="NETWORK_NAME"):
        core.get_property("CPU", "NETWORK_NAME")  # read per compiled model


def test_full_device_name_is_the_processor_model() -> None:
    core = ai.Core()
    name = core.get_property("CPU", "FULL_DEVICE_NAME")
    assert isinstance(name, str) and name
    assert "FULL_DEVICE_NAME" in core.get_property("CPU", "SUPPORTED_PROPERTIES")
    assert not core.get_plugin("CPU").properties["FULL_DEVICE_NAME"].configurable
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [
            line.partition(":")[2].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.partition(":")[0].strip() == "model name"
        ]
        if models:
            assert name == models[0]
    assert core.compile_model(MLP, "CPU").get_property("FULL_DEVICE_NAME") == name


# -- devices, versions, the module-level compile_model ----------------------------------------


def test_available_devices_are_the_ones_that_run_models() -> None:
    core = ai.Core()
    devices = core.get_available_devices()
    assert devices[0] == "CPU"
    assert "BATCH" not in devices and "PROCESS" not in devices  # virtual: run on another
    assert set(devices) <= set(core.available_devices)
    for device in devices:
        _assert_mlp_results(_run(core.compile_model(MLP, device)))


def test_get_versions_names_each_device() -> None:
    core = ai.Core()
    versions = core.get_versions("CPU")
    assert list(versions) == ["CPU"]
    assert versions["CPU"].build_number == ai.__version__
    assert versions["CPU"].description.endswith("CPUPlugin")
    both = core.get_versions("BATCH:CPU")
    assert list(both) == ["BATCH", "CPU"]
    assert both["BATCH"].description.endswith("BatchPlugin")
    with pytest.raises(ai.UnknownDeviceError, match="GPU"):
        core.get_versions("GPU")


def test_module_level_compile_model(tmp_path: Path) -> None:
    compiled = ai.compile_model(MLP, "CPU")
    assert compiled.get_property("DEVICE_NAME") == "CPU"
    _assert_mlp_results(_run(compiled))
    path = _saved(tmp_path)
    streams = ai.compile_model(path, "CPU", {"NUM_STREAMS": 2})
    assert streams.get_property("NUM_STREAMS") == 2


# -- release_memory ---------------------------------------------------------------------------


async def test_release_memory_frees_idle_buffers_and_requests_stay_usable() -> None:
    compiled = ai.Core().compile_model(CHAIN, "CPU")
    expected = reference_outputs(CHAIN, {"x": CHAIN_X})[0]
    first, second = compiled.create_infer_request(), compiled.create_infer_request()
    for results in (
        await first.infer({"x": CHAIN_X}),
        await second.infer({"x": CHAIN_X}),
        await compiled.infer({"x": CHAIN_X}),  # on a pooled request
    ):
        np.testing.assert_allclose(results[0], expected, rtol=RTOL, atol=ATOL)
    held = compiled.get_property("ACTIVATION_MEMORY_BYTES")
    assert held > 0
    compiled.release_memory()
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == 0
    for results in (
        await first.infer({"x": CHAIN_X}),  # plans and allocates again
        await second.infer(),  # its input stayed set
        await compiled.infer({"x": CHAIN_X}),
    ):
        np.testing.assert_allclose(results[0], expected, rtol=RTOL, atol=ATOL)
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == held


async def test_release_memory_leaves_a_running_request_its_buffers() -> None:
    compiled = ai.Core().compile_model(chain_model(steps=40, width=64), "CPU")
    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    idle, running = compiled.create_infer_request(), compiled.create_infer_request()
    expected = (await idle.infer({"x": x}))[0]
    await running.infer({"x": x})
    held = compiled.get_property("ACTIVATION_MEMORY_BYTES")
    assert held > 0
    running.start_async({"x": x})  # busy from here on, whatever the threads do
    compiled.release_memory()
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == held  # the running one's
    with pytest.raises(ai.RequestBusyError):
        running.release_memory()
    np.testing.assert_array_equal((await running.wait())[0], expected)  # type: ignore[index]
    compiled.release_memory()
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == 0
    np.testing.assert_array_equal((await idle.infer({"x": x}))[0], expected)


async def test_release_memory_on_a_batch_model_frees_its_target() -> None:
    compiled = ai.Core().compile_model(CHAIN, "BATCH:CPU")
    expected = reference_outputs(CHAIN, {"x": CHAIN_X})[0]
    np.testing.assert_allclose(
        (await compiled.infer({"x": CHAIN_X}))[0], expected, rtol=RTOL, atol=ATOL
    )
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") > 0
    compiled.release_memory()
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") == 0
    np.testing.assert_allclose(
        (await compiled.infer({"x": CHAIN_X}))[0], expected, rtol=RTOL, atol=ATOL
    )
    assert compiled.get_property("ACTIVATION_MEMORY_BYTES") > 0


# -- AsyncInferQueue --------------------------------------------------------------------------


async def test_queue_iterates_over_its_requests() -> None:
    compiled = ai.Core().compile_model(MLP, "CPU")
    queue = ai.AsyncInferQueue(compiled, 3)
    assert isinstance(queue, Iterable)  # as OpenVINO's is; code tests for it
    requests = list(queue)
    assert len(requests) == len(queue) == 3
    assert requests == [queue[i] for i in range(len(queue))]
    assert len({id(request) for request in requests}) == 3
    inputs = [X + i for i in range(3)]
    for i, x in enumerate(inputs):
        await queue.start_async({"x": x}, userdata=i)
    await queue.wait_all()
    for request in queue:
        assert request.compiled_model is compiled
        assert request.results is not None
        _assert_mlp_results(request.results, inputs[request.userdata])
    await queue.close()


async def test_get_idle_request_id_waits_for_an_idle_request() -> None:
    compiled = ai.Core().compile_model(chain_model(steps=20, width=32), "CPU")
    x = np.ones((4, 32), np.float32)
    queue = ai.AsyncInferQueue(compiled, 2)
    done: list[int] = []
    queue.set_callback(lambda request, userdata: done.append(userdata))
    first = await queue.get_idle_request_id()
    assert queue[first].state is ai.RequestState.IDLE
    await queue.start_async({"x": x}, userdata=first)
    assert queue[first].state is ai.RequestState.BUSY
    second = await queue.get_idle_request_id()
    assert second != first
    await queue.start_async({"x": x}, userdata=second)
    assert not queue.is_ready()
    idle = await queue.get_idle_request_id()  # waits until a job has completed
    assert queue[idle].state is ai.RequestState.IDLE
    assert idle in done
    await queue.start_async({"x": x}, userdata="third")
    assert queue.userdata[idle] == "third"  # the request it named ran the job
    await queue.wait_all()
    await queue.close()
    with pytest.raises(ai.RequestClosedError):
        await queue.get_idle_request_id()


async def test_get_idle_request_id_wakes_up_when_the_queue_closes() -> None:
    compiled = ai.Core().compile_model(MLP, "CPU")
    queue = ai.AsyncInferQueue(compiled, 1)
    gate = anyio.Event()

    async def hold(request: ai.InferRequest, userdata: object) -> None:
        await gate.wait()  # the job cannot settle before the queue is closed

    queue.set_callback(hold)
    await queue.start_async({"x": X})
    outcome: list[BaseException] = []

    async def wait_for_idle() -> None:
        try:
            await queue.get_idle_request_id()
        except ai.RequestClosedError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tasks:
        try:
            tasks.start_soon(wait_for_idle)
            await anyio.wait_all_tasks_blocked()
            assert not outcome  # it waits: the only request is busy
            tasks.start_soon(queue.close)
            await anyio.wait_all_tasks_blocked()
        finally:
            gate.set()  # whatever happened: the job settles, close() returns
    assert len(outcome) == 1


@pytest.mark.parametrize("jobs", [1, 4])
async def test_queue_errors_reach_the_caller_as_in_openvinos_tests(jobs: int) -> None:
    """OpenVINO's queue tests, awaited: an exception raised in the callback (a Python
    one, or a lookup of an unknown tensor) comes out of ``start_async`` or ``wait_all``
    with its type. OpenVINO raises it from every later call and does not run the callback
    of a failed job; aioinfer raises one error per call, the others of the jobs ended by
    then forgotten with it, and tells the callback of every job."""
    compiled = ai.Core().compile_model(MLP, "CPU")
    for callback, error, words in [
        (lambda request, _: request + 21, TypeError, "unsupported operand"),
        (lambda request, _: request.get_tensor("Unknown"), ai.UnknownInputError, "'Unknown'"),
    ]:
        queue = ai.AsyncInferQueue(compiled, jobs)
        queue.set_callback(callback)
        with pytest.raises(error, match=words):
            for _ in range(6):
                await queue.start_async({"x": X})
            await queue.wait_all()
        with contextlib.suppress(error):
            await queue.wait_all()  # the jobs still running then failed too: one is raised
        await queue.wait_all()  # each error was raised or forgotten with the one raised
        await queue.close()
