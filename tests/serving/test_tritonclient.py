"""The unmodified tritonclient (HTTP, sync and asyncio) against a live server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

import aioinfer
from tests.helpers import mlp_model, reference_outputs, two_input_model
from tests.serving.conftest import LiveServer

# Float32 matrix products: batched rows may round differently from onnxruntime's.
RTOL, ATOL = 1e-5, 1e-6


def rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)


def mlp_input(x: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


@pytest.fixture(scope="module")
def client(server: LiveServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "aioinfer"
    assert metadata["version"] == aioinfer.__version__
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_lists_versions_ports_and_dynamic_dims(client):
    metadata = client.get_model_metadata("mlp")
    assert metadata["name"] == "mlp" and metadata["versions"] == ["1", "2"]
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "z", "datatype": "FP32", "shape": [-1, 1]},
    ]
    assert client.get_model_metadata("mlp", "1")["name"] == "mlp"
    plain = client.get_model_metadata("plain")
    assert [(p["name"], p["datatype"]) for p in plain["inputs"]] == [
        ("a", "FP32"),
        ("b", "FP32"),
        ("scale", "INT64"),
    ]
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("nope")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("version", ["1", "2"])
def test_infer_matches_onnxruntime(client, binary, version):
    x = rows(3, seed=int(version))
    outputs = [
        httpclient.InferRequestedOutput("y", binary_data=binary),
        httpclient.InferRequestedOutput("z", binary_data=binary),
    ]
    result = client.infer(
        "mlp", [mlp_input(x, binary)], model_version=version, outputs=outputs, request_id="r-7"
    )
    response = result.get_response()
    assert response["id"] == "r-7"
    assert response["model_name"] == "mlp" and response["model_version"] == version
    assert ("parameters" in response["outputs"][0]) is binary  # binary_data_size
    expected = reference_outputs(mlp_model(seed=int(version) - 1), {"x": x})
    np.testing.assert_allclose(result.as_numpy("y"), expected[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(result.as_numpy("z"), expected[1], rtol=RTOL, atol=ATOL)


def test_latest_version_by_default_and_output_selection(client):
    x = rows(2, seed=5)
    result = client.infer(
        "mlp", [mlp_input(x, True)], outputs=[httpclient.InferRequestedOutput("z")]
    )
    assert result.get_response()["model_version"] == "2"
    assert [o["name"] for o in result.get_response()["outputs"]] == ["z"]
    assert result.as_numpy("y") is None
    expected = reference_outputs(mlp_model(seed=1), {"x": x})[1]
    np.testing.assert_allclose(result.as_numpy("z"), expected, rtol=RTOL, atol=ATOL)


def test_several_input_types(client):
    a = rows(2, seed=1)[:, :3]
    b = rows(2, seed=2)[:, :3]
    scale = np.array([1, 2, 3], np.int64)
    inputs = []
    for name, array, kind, binary in (
        ("a", a, "FP32", True),
        ("b", b, "FP32", False),
        ("scale", scale, "INT64", True),
    ):
        tensor = httpclient.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    result = client.infer("plain", inputs)
    expected = reference_outputs(two_input_model(), {"a": a, "b": b, "scale": scale})[0]
    np.testing.assert_allclose(result.as_numpy("out"), expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("model", "version", "tensor", "status", "words"),
    [
        ("nope", "", ("x", [1, 4], "FP32"), "404", ["unknown model: 'nope' is not found", "'mlp'"]),
        ("mlp", "9", ("x", [1, 4], "FP32"), "404", ["'mlp' version 9 is not found", "1, 2"]),
        ("mlp", "", ("w", [1, 4], "FP32"), "400", ["no input named 'w'", "'x'"]),
        ("mlp", "", ("x", [1, 4], "FP64"), "400", ["'x'", "FP64", "FP32"]),
        ("mlp", "", ("x", [1, 5], "FP32"), "400", ["'x'", "dimension 1 is 5, expected 4"]),
    ],
)
def test_errors_name_the_problem(client, model, version, tensor, status, words):
    name, shape, kind = tensor
    data = np.zeros(shape, np.float64 if kind == "FP64" else np.float32)
    infer_input = httpclient.InferInput(name, shape, kind)
    infer_input.set_data_from_numpy(data, binary_data=True)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [infer_input], model_version=version)
    assert caught.value.status() == status
    for word in words:
        assert word in caught.value.message()
    # The server is fine afterwards.
    assert client.infer("mlp", [mlp_input(rows(1, 0), True)]).as_numpy("y").shape == (1, 3)


def test_unknown_output_and_missing_input_are_400(client):
    with pytest.raises(InferenceServerException, match="no output named 'q'") as caught:
        client.infer(
            "mlp", [mlp_input(rows(1, 0), True)], outputs=[httpclient.InferRequestedOutput("q")]
        )
    assert caught.value.status() == "400"
    a = httpclient.InferInput("a", [1, 3], "FP32")
    a.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match=r"missing input\(s\) 'b', 'scale'"):
        client.infer("plain", [a])


def test_asyncio_client_concurrent_requests_are_batched(server: LiveServer):
    served = server.app.state.server.find("mlp", "1")  # type: ignore[attr-defined]
    before = sum(served.batch_sizes().values())

    async def main() -> list[tuple[np.ndarray, object]]:
        client = aioclient.InferenceServerClient(server.url)
        try:
            assert await client.is_server_ready()
            assert (await client.get_model_metadata("mlp"))["versions"] == ["1", "2"]

            async def one(seed: int) -> tuple[np.ndarray, object]:
                x = rows(1, seed)
                tensor = aioclient.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(x, binary_data=seed % 2 == 0)
                result = await client.infer("mlp", [tensor], model_version="1")
                return x, result

            return await asyncio.gather(*(one(seed) for seed in range(16)))
        finally:
            await client.close()

    for x, result in asyncio.run(main()):
        expected = reference_outputs(mlp_model(seed=0), {"x": x})[0]
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=RTOL, atol=ATOL)
    executions = sum(served.batch_sizes().values()) - before
    assert executions < 16  # coalesced: fewer executions than requests
