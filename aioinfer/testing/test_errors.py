"""Errors users cause, on each device: a specific exception naming the problem, and the
request and compiled model stay usable afterwards."""

from __future__ import annotations

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.models import expected_outputs, reshape_model, two_input_model

pytestmark = pytest.mark.anyio


def x(rows: int = 2) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 10


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        ({"image": x()}, ai.UnknownInputError, "no input named 'image'; its inputs are 'x'"),
        ({3: x()}, ai.UnknownInputError, "there is no input 3"),
        ({"x": x().astype(np.float64)}, ai.InputTypeError, "expected element type float32"),
        ({"x": x()[0]}, ai.InputShapeError, "expected rank 2"),
        ({"x": np.zeros((2, 5), np.float32)}, ai.InputShapeError, "dimension 1 is 5"),
        ([x(), x()], ai.InputError, "2 inputs given by position, the model has 1"),
        (None, ai.MissingInputError, "no value for input(s) 'x'"),
        # A string is a sequence, but of characters: not inputs by position.
        ("some_input", ai.InputTypeError, "incompatible inputs of type str"),
        (b"\x00" * 32, ai.InputTypeError, "incompatible inputs of type bytes"),
    ],
)
async def test_bad_input_then_good_input(mlp, inputs, error, message):
    model, compiled = mlp
    request = compiled.create_infer_request()
    with pytest.raises(error) as caught:
        await request.infer(inputs)
    assert message in str(caught.value)
    assert request.state is ai.RequestState.IDLE
    results = await request.infer({"x": x(3)})
    for got, want in zip(results.to_tuple(), expected_outputs(model, {"x": x(3)})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


async def test_symbolic_dimension_mismatch(core, device):
    compiled = core.compile_model(two_input_model(), device)
    request = compiled.create_infer_request()
    a, b = np.ones((2, 3), np.float32), np.ones((3, 3), np.float32)
    scale = np.array([1, 2, 3], np.int64)
    with pytest.raises(ai.InputShapeError, match="'N'"):
        await request.infer({"a": a, "b": b, "scale": scale})
    results = await request.infer({"a": a, "b": a, "scale": scale})
    np.testing.assert_array_equal(results["out"], np.tile([2.0, 4.0, 6.0], (2, 1)))


async def test_kernel_failure_names_the_node_and_the_request_recovers(core, device):
    compiled = core.compile_model(reshape_model(), device)
    request = compiled.create_infer_request()
    values = np.arange(6, dtype=np.float32)
    with pytest.raises(ai.InferenceError, match="reshape_node"):
        await request.infer({"x": values, "shape": np.array([4, 4], np.int64)})
    assert isinstance(request.error, ai.InferenceError)
    results = await request.infer({"x": values, "shape": np.array([2, 3], np.int64)})
    np.testing.assert_array_equal(results["y"], values.reshape(2, 3))
    assert request.error is None


def test_bad_config_and_properties(core, device, mlp):
    model, compiled = mlp
    with pytest.raises(ai.UnknownPropertyError, match="'FASTEST'"):
        core.compile_model(model, device, {"FASTEST": True})
    with pytest.raises(ai.InvalidPropertyValueError, match="PERFORMANCE_HINT"):
        core.compile_model(model, device, {"PERFORMANCE_HINT": "FAST"})
    with pytest.raises(ai.ReadOnlyPropertyError, match="NETWORK_NAME"):
        core.compile_model(model, device, {"NETWORK_NAME": "other"})
    with pytest.raises(ai.UnknownPropertyError, match="'FASTEST'"):
        compiled.get_property("FASTEST")
    assert compiled.get_property("NETWORK_NAME") == "mlp"
    assert compiled.get_property("DEVICE_NAME") == device
    assert compiled.create_infer_request().infer_sync({"x": x()})["z"].shape == (2, 1)
