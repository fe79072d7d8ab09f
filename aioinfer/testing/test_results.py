"""Results on each device: by name, index and Port; the last results and tensors of a
request; arrays the caller owns; hints and streams."""

from __future__ import annotations

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.plugin.executors import ThreadExecutor
from aioinfer.properties import num_cores
from aioinfer.testing.models import expected_outputs, scaled_model

pytestmark = pytest.mark.anyio

TOL = {"rtol": 1e-5, "atol": 1e-6}


def batch(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


async def test_results_by_name_index_and_port(mlp):
    model, compiled = mlp
    x = batch(3, 0)
    y, z = expected_outputs(model, {"x": x})
    results = await compiled.create_infer_request().infer({"x": x})
    assert isinstance(results, ai.InferResults)
    assert list(results) == ["y", "z"] and len(results) == 2
    np.testing.assert_allclose(results["y"], y, **TOL)
    np.testing.assert_allclose(results[1], z, **TOL)
    np.testing.assert_allclose(results[-1], z, **TOL)
    np.testing.assert_allclose(results[compiled.output("y")], y, **TOL)
    assert results["y"].dtype == np.float32 and results["z"].shape == (3, 1)
    assert list(results.to_dict()) == ["y", "z"]
    assert results.to_tuple()[0] is results["y"]
    with pytest.raises(ai.UnknownInputError, match="no output named 'w'"):
        results["w"]


async def test_input_forms_agree(mlp):
    model, compiled = mlp
    x = batch(2, 1)
    (want, _) = expected_outputs(model, {"x": x})
    request = compiled.create_infer_request()
    by_name = (await request.infer({"x": x}))["y"]
    by_index = (await request.infer({0: x}))["y"]
    by_port = (await request.infer({compiled.input("x"): x}))["y"]
    by_position = (await request.infer([x]))["y"]
    request.set_tensor("x", x)
    preset = (await request.infer())["y"]
    for got in (by_name, by_index, by_port, by_position, preset):
        np.testing.assert_allclose(got, want, **TOL)


async def test_scalars_beside_arrays_and_inputs_by_position(every_device):
    core = ai.Core()
    if "BATCH_TIMEOUT_MS" in core.get_plugin(every_device).properties:
        pytest.skip("a batching device batches no scalar (rank-0) input")
    compiled = core.compile_model(scaled_model(), every_device)
    request = compiled.create_infer_request()
    x = batch(3, 4)[:, :2]
    offset = np.array([0.5, -1.0], np.float32)
    want = x * np.float32(2) + offset
    forms = [
        [x, 2.0, offset],  # by position, a Python float for a float32 scalar
        (x, np.float32(2), offset),  # a tuple, a numpy scalar
        {"x": x, "scale": 2, "offset": [0.5, -1.0]},  # a Python int, a list
        {0: x, 1: np.array(2.0), 2: offset},  # a 0-d array is a scalar too (float64)
        {"scale": np.array(2, np.int32), "offset": offset, "x": x},  # an int 0-d array
    ]
    try:
        for inputs in forms:
            results = await request.infer(inputs)
            np.testing.assert_allclose(results["y"], want, **TOL, err_msg=repr(inputs))
        # Fewer values by position set the first inputs; the others keep theirs.
        other = batch(2, 5)[:, :2]
        results = await request.infer([other])
        np.testing.assert_allclose(results["y"], other * np.float32(2) + offset, **TOL)
        assert request.get_tensor("scale").shape == ()
        # A scalar never converts across kinds, nor an array of another element type.
        with pytest.raises(ai.InputTypeError, match="'scale'"):
            await request.infer({"scale": "2"})
        with pytest.raises(ai.InputTypeError, match="'x'"):
            await request.infer({"x": x.astype(np.float64)})
        with pytest.raises(ai.InputShapeError, match="'scale': expected rank 0"):
            await request.infer({"scale": np.array([2.0], np.float32)})
    finally:
        await compiled.close()


async def test_request_keeps_last_results_and_tensors(mlp):
    model, compiled = mlp
    request = compiled.create_infer_request()
    assert request.results is None
    first, second = batch(2, 2), batch(5, 3)
    kept = (await request.infer({"x": first}))["y"]
    kept_copy = kept.copy()
    results = await request.infer({"x": second})
    # A later inference never writes into arrays handed out before.
    np.testing.assert_array_equal(kept, kept_copy)
    assert request.results is not None
    np.testing.assert_array_equal(request.results["y"], results["y"])
    np.testing.assert_array_equal(request.get_tensor("x"), second)
    np.testing.assert_array_equal(request.get_tensor("z"), results["z"])
    (want, _) = expected_outputs(model, {"x": second})
    np.testing.assert_allclose(results["y"], want, **TOL)


async def test_requests_of_one_compiled_model_are_independent(mlp):
    model, compiled = mlp
    a, b = compiled.create_infer_request(), compiled.create_infer_request()
    xa, xb = batch(2, 4), batch(2, 5)
    a.start_async({"x": xa})
    b.start_async({"x": xb})
    ra, rb = await a.wait(), await b.wait()
    assert ra is not None and rb is not None
    np.testing.assert_allclose(ra["y"], expected_outputs(model, {"x": xa})[0], **TOL)
    np.testing.assert_allclose(rb["y"], expected_outputs(model, {"x": xb})[0], **TOL)


def test_hints_set_streams(core, device, mlp):
    model, _ = mlp
    latency = core.compile_model(model, device, {"PERFORMANCE_HINT": "LATENCY"})
    throughput = core.compile_model(model, device, {"PERFORMANCE_HINT": "THROUGHPUT"})
    explicit = core.compile_model(model, device, {"NUM_STREAMS": 3})
    assert latency.get_property("NUM_STREAMS") == 1
    assert throughput.get_property("NUM_STREAMS") == num_cores()
    assert explicit.get_property("NUM_STREAMS") == 3
    # A device that computes on a pool of its own (not on an engine's threads) sizes it
    # by the streams.
    executor = getattr(explicit, "task_executor", None)
    if isinstance(executor, ThreadExecutor):
        assert executor.workers == 3
    for compiled in (latency, throughput, explicit):
        streams = compiled.get_property("NUM_STREAMS")
        assert compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") > streams - 1
    assert throughput.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
