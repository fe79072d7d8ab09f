"""Hostile and unusual client input against a live server: every case is answered 400
(or 413/415) with ``{"error": ...}`` naming the input, never 500 and never silently
converted; the server then keeps answering correctly. Also: NaN and infinities in JSON,
``"outputs": []``, compressed bodies both ways (tritonclient and raw HTTP), and a real
server fault answered as JSON 500 and counted in the metrics."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.http as httpclient
from starlette.applications import Starlette

import aioinfer
from aioinfer.devices.cpu.plugin import CPUCompiledModel, CPUPlugin
from aioinfer.devices.cpu.request import CPUInferRequest
from aioinfer.model import Model
from aioinfer.serving import create_app
from tests.helpers import make_model, mlp_model, reference_outputs, tensor_info
from tests.helpers import scrape_metric as metric
from tests.serving.conftest import LiveServer, write_config, write_model

LIMIT = 1 << 20
"""The servers' request size limit (bytes)."""


def identity_model() -> Any:
    """Each input comes back as its output: ``i`` INT8, ``f`` FP32, ``h`` FP16, ``s``
    BYTES, all of shape ``["n"]`` (outputs ``i_out``...)."""
    kinds = {"i": np.int8, "f": np.float32, "h": np.float16, "s": object}
    nodes = [oh.make_node("Identity", [name], [f"{name}_out"]) for name in kinds]
    inputs = [tensor_info(name, kind, ["n"]) for name, kind in kinds.items()]
    outputs = [tensor_info(f"{name}_out", kind, ["n"]) for name, kind in kinds.items()]
    return make_model(nodes, inputs, outputs, name="identity")


class FaultyRequest(CPUInferRequest):
    """A device fault that is nobody's input error: the outputs never arrive."""

    def infer_postprocess(self) -> None:
        raise RuntimeError("the device lost its output buffers")


class FaultyCompiledModel(CPUCompiledModel):
    def create_sync_infer_request(self) -> FaultyRequest:
        return FaultyRequest(self)


class FaultyPlugin(CPUPlugin):
    """The CPU device, except that every inference fails with a non-aioinfer error (a
    third-party device with a bug)."""

    device_name = "FAULTY"

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> FaultyCompiledModel:
        parsed = self.parse_config(config)
        return FaultyCompiledModel.compile(self, model, parsed)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("hostile")
    write_model(repo, "identity", 1, identity_model())
    write_config(repo, "identity", {"device": "CPU"})  # BYTES kept as bytes, not str
    write_model(repo, "mlp", 1, mlp_model(seed=3))
    write_model(repo, "faulty", 1, mlp_model(seed=3))
    write_config(repo, "faulty", {"device": "FAULTY"})
    return repo


def faulty_core() -> aioinfer.Core:
    core = aioinfer.Core()
    core.register_plugin(FaultyPlugin())
    return core


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveServer]:
    app = create_app(repository, core=faulty_core(), max_request_bytes=LIMIT)
    with LiveServer(app) as live:
        yield live


def spec(name: str, datatype: str, data: Any, shape: list[int] | None = None) -> dict[str, Any]:
    size = len(data) if isinstance(data, list) else 1
    return {"name": name, "datatype": datatype, "shape": shape or [size], "data": data}


def identity_request(**changes: Any) -> dict[str, Any]:
    """A valid request for the identity model, with the given inputs' specs replaced."""
    inputs = {
        "i": spec("i", "INT8", [1, -2]),
        "f": spec("f", "FP32", [0.5, -1.25]),
        "h": spec("h", "FP16", [2.0, 3.5]),
        "s": spec("s", "BYTES", ["a", "b"]),
    }
    inputs.update(changes)
    return {"inputs": list(inputs.values())}


def post(
    server: LiveServer,
    body: dict[str, Any] | bytes,
    model: str = "identity",
    headers: Mapping[str, str] | None = None,
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    url = f"http://{server.url}/v2/models/{model}/infer"
    return httpx.post(url, content=content, headers=headers, timeout=60)


def strict_json(content: bytes) -> Any:
    """JSON as a strict parser (a browser's ``response.json()``) reads it: no NaN or
    Infinity literals."""

    def refuse(literal: str) -> Any:
        raise ValueError(f"{literal} is not JSON")

    return json.loads(content, parse_constant=refuse)


def assert_refused(response: httpx.Response, *fragments: str, status: int = 400) -> str:
    """``response`` is an error with ``status`` whose JSON message holds ``fragments``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = strict_json(response.content)["error"]
    for fragment in fragments:
        assert fragment in error, error
    return str(error)


def assert_still_serving(server: LiveServer) -> None:
    """A valid request right after: every output exactly as sent."""
    response = post(server, identity_request())
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in strict_json(response.content)["outputs"]}
    assert outputs == {
        "i_out": [1, -2],
        "f_out": [0.5, -1.25],
        "h_out": [2.0, 3.5],
        "s_out": ["a", "b"],
    }


# -- values that do not fit their datatype -------------------------------------------------


@pytest.mark.parametrize(
    ("data", "shown"),
    [([1, 300], "is 300, out of the range of INT8 [-128, 127]"), ([-129], "is -129")],
)
def test_an_integer_out_of_range_is_refused(server: LiveServer, data: list[int], shown: str):
    response = post(server, identity_request(i=spec("i", "INT8", data)))
    assert_refused(response, "input 'i'", f"element {len(data) - 1} of 'data'", shown)
    assert_still_serving(server)


def test_a_fraction_in_integer_data_is_refused(server: LiveServer):
    response = post(server, identity_request(i=spec("i", "INT8", [2, 1.5])))
    assert_refused(response, "input 'i'", "element 1 of 'data' is 1.5, not an integer (INT8)")
    assert_still_serving(server)


def test_null_in_float_data_is_refused(server: LiveServer):
    response = post(server, identity_request(f=spec("f", "FP32", [1.0, None])))
    assert_refused(response, "input 'f'", "element 1 of 'data' is null, not a number")
    assert_still_serving(server)


@pytest.mark.parametrize(
    ("name", "datatype", "number", "shown"),
    [
        ("f", "FP32", "1e39", "is 1e+39, out of the range of FP32"),
        ("h", "FP16", "70000", "is 70000.0, out of the range of FP16"),
        ("f", "FP32", "1e999", "is a number beyond the range of FP64"),
    ],
)
def test_a_number_beyond_the_float_range_is_refused(
    server: LiveServer, name: str, datatype: str, number: str, shown: str
):
    # Written by hand: Python's json writes 1e999 as Infinity.
    body = json.dumps(identity_request(**{name: spec(name, datatype, [1.0, 0.0])}))
    body = body.replace('"data": [1.0, 0.0]', f'"data": [1.0, {number}]')
    assert_refused(post(server, body.encode()), f"input {name!r}", "element 1", shown)
    assert_still_serving(server)


@pytest.mark.parametrize(
    ("name", "datatype", "data", "shown"),
    [
        ("f", "FP32", [1.0, "2.5"], 'is "2.5", not a number'),
        ("i", "INT8", [True, False], "is true, not an integer"),
        ("s", "BYTES", ["a", 7], "is 7, not a string"),
    ],
)
def test_a_value_of_another_json_type_is_refused(
    server: LiveServer, name: str, datatype: str, data: list[Any], shown: str
):
    response = post(server, identity_request(**{name: spec(name, datatype, data)}))
    assert_refused(response, f"input {name!r}", shown)
    assert_still_serving(server)


def test_a_lone_surrogate_in_bytes_data_is_refused(server: LiveServer):
    body = identity_request(s=spec("s", "BYTES", ["ok", "\ud800"]))
    body["outputs"] = [{"name": "s_out", "parameters": {"binary_data": True}}]
    response = post(server, json.dumps(body).encode())  # ASCII: the escape \ud800
    assert_refused(response, "input 's'", "element 1", "not valid Unicode")
    assert_still_serving(server)


# -- headers, nesting and shapes -----------------------------------------------------------


def test_a_5000_digit_header_length_is_refused(server: LiveServer):
    headers = {"Inference-Header-Content-Length": "9" * 5000}
    response = post(server, identity_request(), headers=headers)
    assert_refused(response, "Inference-Header-Content-Length", "(5000 characters)")
    assert_still_serving(server)


def test_deeply_nested_json_is_refused(server: LiveServer):
    depth = 100_000
    body = b'{"inputs": [{"name": "f", "data": ' + b"[" * depth + b"]" * depth + b"}]}"
    assert_refused(post(server, body), "nests arrays or objects too deeply")
    assert_still_serving(server)


def test_deeply_nested_data_is_refused(server: LiveServer):
    nested: Any = 1.0
    for _ in range(100):  # within the JSON parser's depth, beyond numpy's
        nested = [nested]
    response = post(server, identity_request(f=spec("f", "FP32", nested, shape=[1])))
    assert_refused(response, "input 'f'", "not FP32 values")
    assert_still_serving(server)


def test_more_than_32_dimensions_are_refused(server: LiveServer):
    response = post(server, identity_request(f=spec("f", "FP32", [1.0], shape=[1] * 65)))
    assert_refused(response, "input 'f'", "has 65 dimensions, at most 32")
    assert_still_serving(server)


@pytest.mark.parametrize(
    ("shape", "data"),
    [([10**18], [1.0]), ([0, 2**70], []), ([2**40, 2**40], [1.0]), ([0, 2**62, 4], [])],
)
def test_giant_shapes_are_refused(server: LiveServer, shape: list[int], data: list[Any]):
    response = post(server, identity_request(f=spec("f", "FP32", data, shape=shape)))
    assert_refused(response, "input 'f'")
    assert_still_serving(server)


def test_a_binary_data_size_of_true_is_refused(server: LiveServer):
    header = json.dumps(
        {"inputs": [{**spec("f", "FP32", []), "parameters": {"binary_data_size": True}}]}
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    response = post(server, header + b"\x00", headers=headers)
    assert_refused(response, "input 'f': binary_data_size True")
    assert_still_serving(server)


# -- outputs -------------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_are_refused_as_json_and_served_as_binary(server: LiveServer):
    raw = b"\xff\xfe"
    header = json.dumps(
        {
            "inputs": [
                spec("i", "INT8", [1]),
                spec("f", "FP32", [1.0]),
                spec("h", "FP16", [1.0]),
                {"name": "s", "datatype": "BYTES", "shape": [1]}
                | {"parameters": {"binary_data_size": 4 + len(raw)}},
            ],
            "outputs": [{"name": "s_out"}],
        }
    ).encode()
    body = header + len(raw).to_bytes(4, "little") + raw
    headers = {"Inference-Header-Content-Length": str(len(header))}
    response = post(server, body, headers=headers)
    assert_refused(response, "output 's_out'", "element 0", "not UTF-8", "binary_data")
    # Asked for as binary data, the same bytes come back unchanged.
    binary = body.replace(
        b'{"name": "s_out"}', b'{"name": "s_out", "parameters": {"binary_data": true}}'
    )
    length = len(header) + len(binary) - len(body)
    response = post(server, binary, headers={"Inference-Header-Content-Length": str(length)})
    assert response.status_code == 200, response.text
    split = int(response.headers["inference-header-content-length"])
    assert response.content[split:] == len(raw).to_bytes(4, "little") + raw
    assert_still_serving(server)


def test_nan_and_infinities_are_strings_in_json_both_ways(server: LiveServer):
    given = ["NaN", "Infinity", "-Infinity", 1.5]
    body = identity_request(
        i=spec("i", "INT8", [1, 2, 3, 4]),
        f=spec("f", "FP32", given),
        h=spec("h", "FP16", given),
        s=spec("s", "BYTES", ["a", "b", "c", "d"]),
    )
    response = post(server, body)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in strict_json(response.content)["outputs"]}
    assert outputs["f_out"] == given and outputs["h_out"] == given
    # The bare literals (Python's json and Triton write them) mean the same.
    literal = json.dumps(identity_request(f=spec("f", "FP32", [float("nan"), float("-inf")])))
    assert "NaN" in literal and "-Infinity" in literal
    response = post(server, literal.encode())
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in strict_json(response.content)["outputs"]}
    assert outputs["f_out"] == ["NaN", "-Infinity"]
    # tritonclient reads the strings back as floats.
    client = httpclient.InferenceServerClient(server.url)
    tensors = []
    for name, datatype, values in [
        ("i", "INT8", np.array([1, 2], np.int8)),
        ("f", "FP32", np.array([np.nan, np.inf], np.float32)),
        ("h", "FP16", np.array([-np.inf, 0.5], np.float16)),
        ("s", "BYTES", np.array([b"x", b"y"], dtype=object)),
    ]:
        tensor = httpclient.InferInput(name, [2], datatype)
        tensor.set_data_from_numpy(values, binary_data=datatype == "BYTES")
        tensors.append(tensor)
    outputs_wanted = [
        httpclient.InferRequestedOutput(n, binary_data=False) for n in ("f_out", "h_out")
    ]
    result = client.infer("identity", tensors, outputs=outputs_wanted)
    np.testing.assert_array_equal(result.as_numpy("f_out"), np.array([np.nan, np.inf], np.float32))
    np.testing.assert_array_equal(result.as_numpy("h_out"), np.array([-np.inf, 0.5], np.float16))
    assert_still_serving(server)


def test_an_empty_outputs_list_answers_every_output(server: LiveServer):
    response = post(server, identity_request() | {"outputs": []})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    names = [o["name"] for o in strict_json(response.content)["outputs"]]
    assert names == ["i_out", "f_out", "h_out", "s_out"]
    # All binary by default: the same outputs, as binary data.
    response = post(
        server, identity_request() | {"outputs": [], "parameters": {"binary_data_output": True}}
    )
    assert response.status_code == 200, response.text
    split = int(response.headers["inference-header-content-length"])
    header = strict_json(response.content[:split])
    assert [o["name"] for o in header["outputs"]] == names
    assert all("binary_data_size" in o["parameters"] for o in header["outputs"])


# -- a fault of the server -------------------------------------------------------------------


def test_a_server_fault_is_json_500_and_counted(server: LiveServer):
    before = metric(server.url, "aioinfer_inference_failures_total", model="faulty", reason="error")
    x = np.ones((1, 4), np.float32)
    body = {"inputs": [spec("x", "FP32", x.ravel().tolist(), shape=[1, 4])]}
    response = post(server, body, model="faulty")
    assert_refused(response, "internal server error", "RuntimeError", "lost its output", status=500)
    after = metric(server.url, "aioinfer_inference_failures_total", model="faulty", reason="error")
    assert after == before + 1
    assert_still_serving(server)


# -- compression ---------------------------------------------------------------------------


def mlp_rows(count: int) -> np.ndarray:
    return np.random.default_rng(count).standard_normal((count, 4)).astype(np.float32)


@pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_compression(
    server: LiveServer, request_algorithm: str | None, response_algorithm: str | None, binary: bool
):
    client = httpclient.InferenceServerClient(server.url)
    x = mlp_rows(5)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "z")]
    result = client.infer(
        "mlp",
        [tensor],
        outputs=outputs,
        request_compression_algorithm=request_algorithm,
        response_compression_algorithm=response_algorithm,
    )
    expected = reference_outputs(mlp_model(seed=3), {"x": x})
    np.testing.assert_allclose(result.as_numpy("y"), expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("z"), expected[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("accept", "coding"),
    [("gzip", "gzip"), ("deflate", "deflate"), ("br;q=1, deflate;q=0.5, gzip;q=0.8", "gzip")],
)
def test_responses_are_compressed_as_the_client_accepts(
    server: LiveServer, accept: str, coding: str
):
    x = mlp_rows(3)
    body = {"inputs": [spec("x", "FP32", x.ravel().tolist(), shape=[3, 4])]}
    url = f"http://{server.url}/v2/models/mlp/infer"
    request = httpx.Request("POST", url, json=body, headers={"Accept-Encoding": accept})
    with httpx.Client() as client:
        response = client.send(request, stream=True)
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200 and response.headers["content-encoding"] == coding
    plain = gzip.decompress(raw) if coding == "gzip" else zlib.decompress(raw)
    outputs = strict_json(plain)["outputs"]
    expected = reference_outputs(mlp_model(seed=3), {"x": x})
    np.testing.assert_allclose(np.array(outputs[0]["data"]).reshape(3, 3), expected[0], rtol=1e-5)


@pytest.mark.parametrize(("rows", "coding"), [(3, None), (6000, "gzip")])
def test_small_binary_responses_are_not_compressed(server: LiveServer, rows: int, coding):
    """Binary tensor bytes shrink little: below 64 KiB they go uncompressed although the
    client accepts gzip (as aiohttp, under tritonclient's asyncio client, always says)."""
    x = mlp_rows(rows)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [rows, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
        "Accept-Encoding": "gzip, deflate",
    }
    url = f"http://{server.url}/v2/models/mlp/infer"
    request = httpx.Request("POST", url, content=header + x.tobytes(), headers=headers)
    with httpx.Client() as client:
        response = client.send(request, stream=True)
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200
    assert response.headers.get("content-encoding") == coding
    plain = raw if coding is None else gzip.decompress(raw)
    length = int(response.headers["inference-header-content-length"])
    expected = reference_outputs(mlp_model(seed=3), {"x": x})[0]
    y = np.frombuffer(plain[length : length + expected.nbytes], np.float32)
    np.testing.assert_allclose(y.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)


def mlp_body(rows: int = 2) -> bytes:
    x = mlp_rows(rows)
    return json.dumps({"inputs": [spec("x", "FP32", x.ravel().tolist(), shape=[rows, 4])]}).encode()


def test_a_raw_deflate_stream_is_accepted(server: LiveServer):
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    body = raw.compress(mlp_body()) + raw.flush()
    response = post(server, body, model="mlp", headers={"Content-Encoding": "deflate"})
    assert response.status_code == 200, response.text
    assert strict_json(response.content)["outputs"][0]["shape"] == [2, 3]


@pytest.mark.parametrize(
    ("coding", "body", "status", "message"),
    [
        ("gzip", gzip.compress(b" " * (8 * LIMIT)), 413, f"more than the limit of {LIMIT} bytes"),
        ("deflate", zlib.compress(b" " * (LIMIT + 1)), 413, "more than the limit"),
        ("gzip", b"not gzip at all", 400, "not valid gzip data"),
        ("gzip", gzip.compress(mlp_body())[:-12], 400, "truncated"),
        ("deflate", zlib.compress(mlp_body()) + b"tail", 400, "4 bytes follow the deflate data"),
        ("br", mlp_body(), 415, "Content-Encoding 'br' is not supported"),
    ],
    ids=["gzip-bomb", "deflate-bomb", "corrupt", "truncated", "trailing", "unknown"],
)
def test_bad_compressed_bodies_are_refused(
    server: LiveServer, coding: str, body: bytes, status: int, message: str
):
    response = post(server, body, model="mlp", headers={"Content-Encoding": coding})
    assert_refused(response, message, status=status)
    assert (
        metric(server.url, "aioinfer_inference_failures_total", model="mlp", reason="bad_request")
        > 0
    )
    assert post(server, mlp_body(), model="mlp").status_code == 200


# In-process, on asyncio and trio: large bodies are (de)compressed on a worker thread.


@pytest.fixture(scope="module")
async def app(repository: Path, anyio_backend: str) -> AsyncIterator[Starlette]:
    served = create_app(repository, core=faulty_core(), max_request_bytes=LIMIT)
    async with served.router.lifespan_context(served):
        yield served


@pytest.mark.anyio
async def test_large_compressed_bodies_in_process(app: Starlette):
    x = np.random.default_rng(0).standard_normal((2000, 4)).astype(np.float32)
    body = json.dumps({"inputs": [spec("x", "FP32", x.ravel().tolist(), shape=[2000, 4])]})
    compressed = gzip.compress(body.encode())
    assert len(compressed) > 1 << 12  # beyond what is decompressed on the event loop
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://oip") as client:
        response = await client.post(
            "/v2/models/mlp/infer",
            content=compressed,
            headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
        )
    assert response.status_code == 200, response.text
    assert response.headers["content-encoding"] == "gzip"
    assert len(response.content) > 1 << 16  # beyond what is compressed on the event loop
    outputs = strict_json(response.content)["outputs"]  # httpx decompressed it
    expected = reference_outputs(mlp_model(seed=3), {"x": x})
    np.testing.assert_allclose(
        np.array(outputs[0]["data"]).reshape(2000, 3), expected[0], rtol=1e-5, atol=1e-6
    )
