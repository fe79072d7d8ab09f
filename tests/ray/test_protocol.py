"""Protocol parity: the same requests through Ray Serve's proxy and ``aioinfer serve``
(the REST app under uvicorn) get the same statuses, bodies and tensors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import aioinfer
from aioinfer.serving import create_app
from tests.helpers import mlp_model, reference_outputs
from tests.ray.conftest import RayApp
from tests.serving.conftest import LiveServer

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def local(ray_app: RayApp) -> Iterator[LiveServer]:
    """``aioinfer serve`` on the same repository (its ``ray`` config keys unused)."""
    with LiveServer(create_app(ray_app.repository)) as live:
        yield live


def x_json(rows: list[list[float]], **extra: Any) -> dict[str, Any]:
    shape = [len(rows), len(rows[0])]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": rows}]}
    return {**body, **extra}


ROWS = [[1.0, -2.0, 0.5, 3.0], [0.25, 0.0, -1.0, 2.0]]

REQUESTS: list[tuple[str, str, Any]] = [
    ("GET", "/v2/health/live", None),
    ("GET", "/v2/health/ready", None),
    ("GET", "/v2", None),
    ("GET", "/v2/models/mlp", None),
    ("GET", "/v2/models/mlp/versions/1", None),
    ("GET", "/v2/models/accumulator", None),
    ("GET", "/v2/models/mlp/ready", None),
    ("GET", "/v2/models/mlp/versions/2/ready", None),
    ("GET", "/v2/models/nope", None),
    ("GET", "/v2/models/mlp/versions/9", None),
    ("GET", "/v2/models/nope/ready", None),
    ("GET", "/v2/nothing/here", None),
    ("GET", "/v2/models/mlp/infer", None),
    ("POST", "/v2/models/mlp/infer", x_json(ROWS, id="r-1")),
    ("POST", "/v2/models/mlp/versions/1/infer", x_json(ROWS, outputs=[{"name": "z"}])),
    ("POST", "/v2/models/nope/infer", x_json(ROWS)),
    ("POST", "/v2/models/mlp/versions/9/infer", x_json(ROWS)),
    ("POST", "/v2/models/mlp/infer", x_json(ROWS, outputs=[{"name": "w"}])),
    ("POST", "/v2/models/mlp/infer", {"inputs": [{"name": "w", "datatype": "FP32"}]}),
    ("POST", "/v2/models/mlp/infer", {"inputs": [{"name": "x", "datatype": "FP64"}]}),
    ("POST", "/v2/models/mlp/infer", {"inputs": []}),
    ("POST", "/v2/models/mlp/infer", b"{not json"),
    (
        "POST",
        "/v2/models/mlp/infer",
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [1] * 5}]},
    ),
    (
        "POST",
        "/v2/models/accumulator/infer",
        {
            "inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]}],
            "parameters": {"sequence_id": 4242},
        },
    ),
]


def exchange(url: str, method: str, path: str, body: Any) -> tuple[int, Any]:
    content = body if isinstance(body, bytes) else None if body is None else json.dumps(body)
    response = httpx.request(method, f"http://{url}{path}", content=content, timeout=60)
    return response.status_code, response.json()


@pytest.mark.parametrize(("method", "path", "body"), REQUESTS)
def test_same_status_and_body_as_aioinfer_serve(ray_app, local, method, path, body):
    expected = exchange(local.url, method, path, body)
    assert exchange(ray_app.url, method, path, body) == expected


def test_errors_name_the_problem_as_aioinfer_serve_does(ray_app):
    status, body = exchange(ray_app.url, *REQUESTS[-1])
    assert status == 400
    assert "sequence 4242 of model 'accumulator' is not active" in body["error"]
    status, body = exchange(ray_app.url, "POST", "/v2/models/nope/infer", x_json(ROWS))
    served = "'accumulator', 'mlp', 'slow'"
    assert (status, body) == (
        404,
        {"error": f"Request for unknown model: 'nope' is not found; served models: {served}"},
    )


@pytest.fixture(scope="module")
def client(ray_app: RayApp) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(ray_app.url)


def test_tritonclient_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert (metadata["name"], metadata["version"]) == ("aioinfer", aioinfer.__version__)
    assert set(metadata["extensions"]) >= {"binary_tensor_data", "sequence"}
    assert client.get_model_metadata("mlp")["versions"] == ["1", "2"]
    assert client.is_model_ready("mlp", "1") and not client.is_model_ready("nope")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("version", ["1", "2"])
def test_tritonclient_infer_matches_onnxruntime(client, binary, version):
    x = np.random.default_rng(int(version)).standard_normal((3, 4)).astype(np.float32)
    tensor = httpclient.InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "z")]
    result = client.infer("mlp", [tensor], model_version=version, outputs=outputs, request_id="7")
    response = result.get_response()
    assert (response["id"], response["model_version"]) == ("7", version)
    assert ("parameters" in response["outputs"][0]) is binary  # binary_data_size
    expected = reference_outputs(mlp_model(seed=int(version) - 1), {"x": x})
    np.testing.assert_allclose(result.as_numpy("y"), expected[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(result.as_numpy("z"), expected[1], rtol=RTOL, atol=ATOL)


def test_tritonclient_sees_the_same_errors(client, local):
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    messages = []
    for target in (client, httpclient.InferenceServerClient(local.url)):
        with pytest.raises(InferenceServerException) as caught:
            target.infer("mlp", [tensor], model_version="9")
        messages.append((caught.value.status(), caught.value.message()))
    assert messages[0] == messages[1]
    assert messages[0][0] == "404" and "'mlp' version 9 is not found" in messages[0][1]
