"""KServe v2 gRPC against a live server with the unmodified ``tritonclient.grpc`` and
``tritonclient.grpc.aio``: health, metadata, infer (every datatype, raw and typed
contents), the REST errors' messages, sequences, ModelStreamInfer, cancellation.

The async cases run under asyncio only: grpc.aio (the server's and tritonclient's asyncio
client) is built on asyncio's event loop and has no trio counterpart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import aioinfer
from aioinfer.errors import ErrorKind
from aioinfer.serving.grpc.server import GRPC_STATUS, NOT_YET
from tests.helpers import make_model, mlp_model, reference_outputs, tensor_info, wait_until
from tests.helpers import scrape_metric as metric
from tests.serving.conftest import (
    EVERY_VERSION,
    WIDE,
    accumulator_model,
    chain_model,
    write_config,
    write_model,
)
from tests.serving.grpc.live import LiveGrpcServer

# Float32 matrix products: batched rows may round differently from onnxruntime's.
RTOL, ATOL = 1e-5, 1e-6

NUMPY_TYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
"""Every datatype tritonclient sends, and its numpy type."""

TYPED_FIELDS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The protocol's typed field of each datatype (FP16 has none)."""

SLOW_ROWS = 1024


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # grpc.aio is asyncio's


def identity_model(names: list[str]) -> Any:
    """Input ``in_<DATATYPE>`` of shape ``["n", 3]`` comes back as ``out_<DATATYPE>``, for
    each of the datatypes ``names``."""
    nodes = [oh.make_node("Identity", [f"in_{n}"], [f"out_{n}"]) for n in names]
    inputs = [tensor_info(f"in_{n}", NUMPY_TYPES[n], ["n", 3]) for n in names]
    outputs = [tensor_info(f"out_{n}", NUMPY_TYPES[n], ["n", 3]) for n in names]
    return make_model(nodes, inputs, outputs, name="identity")


def values(kind: str, rows: int = 2, seed: int = 0) -> np.ndarray:
    """``rows`` x 3 values of datatype ``kind`` that use its range (extremes included)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(NUMPY_TYPES[kind])
    if kind == "BYTES":
        words = [b"", b"alpha", "\u00e9t\u00e9".encode(), b"\x00\xff raw", b"z" * 300, b"b"]
        return np.array((words * rows)[: rows * 3], dtype=object).reshape(rows, 3)
    if kind == "BOOL":
        return rng.integers(0, 2, (rows, 3)).astype(bool)
    if dtype.kind == "f":
        array = rng.standard_normal((rows, 3)).astype(dtype)
        array.flat[0] = np.finfo(dtype).max
        return array
    info = np.iinfo(dtype)
    array = rng.integers(0, 100, (rows, 3)).astype(dtype)
    array.flat[0], array.flat[1] = info.min, info.max
    return array


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("grpc")
    write_model(repo, "mlp", 1, mlp_model(seed=0))
    write_model(repo, "mlp", 2, mlp_model(seed=1))
    write_config(repo, "mlp", {"batching": {"max_batch_size": 8, "timeout_ms": 5}, **EVERY_VERSION})
    write_model(repo, "identity", 1, identity_model(list(NUMPY_TYPES)))
    write_model(repo, "typed", 1, identity_model(list(TYPED_FIELDS)))
    write_model(repo, "slow", 1, chain_model(300))
    write_config(repo, "slow", {"max_concurrency": 1, "max_queue": 1})
    write_model(repo, "accumulator", 1, accumulator_model())
    write_config(
        repo, "accumulator", {"stateful": {"state": "state_out"}, "sequence_idle_timeout_s": 5}
    )
    write_model(repo, "one_sequence", 1, accumulator_model())
    write_config(repo, "one_sequence", {"stateful": {"state": "state_out"}, "max_sequences": 1})
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveGrpcServer]:
    with LiveGrpcServer(repository) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveGrpcServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)


def tensor(name: str, array: np.ndarray, kind: str = "FP32") -> grpcclient.InferInput:
    infer_input = grpcclient.InferInput(name, list(array.shape), kind)
    infer_input.set_data_from_numpy(array)
    return infer_input


# -- health and metadata ---------------------------------------------------------------------


def test_health_and_metadata(client: grpcclient.InferenceServerClient):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "9")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "aioinfer" and metadata["version"] == aioinfer.__version__
    assert "sequence" in metadata["extensions"]
    model = client.get_model_metadata("mlp", as_json=True)
    assert model["name"] == "mlp" and model["versions"] == ["1", "2"]
    assert model["platform"] == "onnx"
    # The protobuf JSON form writes int64 as strings.
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert [(o["name"], o["shape"]) for o in model["outputs"]] == [
        ("y", ["-1", "3"]),
        ("z", ["-1", "1"]),
    ]
    identity = client.get_model_metadata("identity")
    assert [t.datatype for t in identity.inputs] == list(NUMPY_TYPES)
    with pytest.raises(InferenceServerException, match="unknown model: 'nope'") as caught:
        client.get_model_metadata("nope")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_the_rpcs_not_served_are_unimplemented_and_named(client):
    assert set(NOT_YET) == {"TraceSetting", "LogSettings"}
    with pytest.raises(InferenceServerException, match="trace settings") as caught:
        client.get_trace_settings()
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException, match="log settings"):
        client.get_log_settings()
    assert client.is_server_ready()


# -- infer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1", "2"])
def test_infer_matches_onnxruntime_and_echoes_the_request_id(client, version):
    x = rows(3, seed=int(version))
    wanted = [grpcclient.InferRequestedOutput("z"), grpcclient.InferRequestedOutput("y")]
    result = client.infer(
        "mlp", [tensor("x", x)], model_version=version, outputs=wanted, request_id="r-7"
    )
    response = result.get_response()
    assert response.id == "r-7"
    assert response.model_name == "mlp" and response.model_version == version
    assert [o.name for o in response.outputs] == ["z", "y"]  # in the order asked for
    expected = reference_outputs(mlp_model(seed=int(version) - 1), {"x": x})
    np.testing.assert_allclose(result.as_numpy("y"), expected[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(result.as_numpy("z"), expected[1], rtol=RTOL, atol=ATOL)
    # No outputs named: every output, in the model's order; no id: none.
    result = client.infer("mlp", [tensor("x", x)], model_version=version)
    assert [o.name for o in result.get_response().outputs] == ["y", "z"]
    assert result.get_response().id == ""


def test_every_datatype_round_trips_exactly_in_raw_contents(client):
    arrays = {kind: values(kind, rows=2, seed=i) for i, kind in enumerate(NUMPY_TYPES)}
    inputs = [tensor(f"in_{kind}", array, kind) for kind, array in arrays.items()]
    result = client.infer("identity", inputs)
    for kind, array in arrays.items():
        output = result.as_numpy(f"out_{kind}")
        assert output.dtype == array.dtype and output.shape == (2, 3), kind
        np.testing.assert_array_equal(output, array, err_msg=kind)
    # Empty tensors too.
    empty = {kind: np.zeros((0, 3), NUMPY_TYPES[kind]) for kind in NUMPY_TYPES}
    result = client.infer("identity", [tensor(f"in_{k}", a, k) for k, a in empty.items()])
    assert all(result.as_numpy(f"out_{k}").shape == (0, 3) for k in NUMPY_TYPES)


def stub(server: LiveGrpcServer) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def typed_request(arrays: dict[str, np.ndarray], model: str = "identity") -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, id="typed")
    for kind, array in arrays.items():
        spec = request.inputs.add(name=f"in_{kind}", datatype=kind, shape=array.shape)
        getattr(spec.contents, TYPED_FIELDS[kind]).extend(array.reshape(-1).tolist())
    return request


def test_typed_contents_rules(server):
    """FP16 has no typed field; raw contents are for every input or none; typed contents
    alone work (the mlp's FP32)."""
    channel, service = stub(server)
    with channel:
        fp16 = service_pb2.ModelInferRequest(model_name="identity")
        fp16.inputs.add(name="in_FP16", datatype="FP16", shape=[1, 3])
        with pytest.raises(grpc.RpcError) as caught:
            service.ModelInfer(fp16)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == (
            "input 'in_FP16': FP16 has no typed contents field; send it in raw_input_contents"
        )
        x = rows(2, seed=3)
        typed = service_pb2.ModelInferRequest(model_name="mlp", id="t")
        spec = typed.inputs.add(name="x", datatype="FP32", shape=x.shape)
        spec.contents.fp32_contents.extend(x.reshape(-1).tolist())
        response = service.ModelInfer(typed)
        assert response.id == "t"
        y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 3)
        expected = reference_outputs(mlp_model(seed=1), {"x": x})
        np.testing.assert_allclose(y, expected[0], rtol=RTOL, atol=ATOL)
        typed.raw_input_contents.extend([x.tobytes(), b""])
        with pytest.raises(grpc.RpcError) as caught:
            service.ModelInfer(typed)
        assert caught.value.details() == (
            "raw_input_contents has 2 entries for 1 inputs: give one per input, in input "
            "order, or none"
        )
        short = service_pb2.ModelInferRequest(model_name="mlp")
        spec = short.inputs.add(name="x", datatype="FP32", shape=[2, 4])
        spec.contents.fp32_contents.extend([1.0] * 7)
        with pytest.raises(grpc.RpcError) as caught:
            service.ModelInfer(short)
        assert caught.value.details() == (
            "input 'x': 7 values in contents.fp32_contents, the shape needs 8"
        )


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([2, -4], "input 'x': 'shape' must be a list of integers >= 0, got [2, -4]"),
        ([1] * 33, "input 'x': 'shape' has 33 dimensions, at most 32 are supported"),
        ([0, 2**40, 2**40], f"input 'x': 'shape' {[0, 2**40, 2**40]} is too large"),
        ([2, 4], "input 'x': 4 binary bytes, the shape needs 8 x 4 = 32"),
    ],
    ids=["negative", "rank", "huge-empty", "size"],
)
def test_bad_shapes_are_refused_by_name(server, shape, message):
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=shape)
    request.raw_input_contents.append(b"\0" * 4)
    channel, service = stub(server)
    with channel, pytest.raises(grpc.RpcError) as caught:
        service.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == message


def test_typed_contents_of_every_datatype_round_trip(server):
    """A model that takes every datatype but FP16: each typed field read exactly."""
    arrays = {kind: values(kind, seed=11) for kind in TYPED_FIELDS}
    channel, service = stub(server)
    with channel:
        response = service.ModelInfer(typed_request(arrays, model="typed"))
    got = grpcclient.InferResult(response)
    for kind, array in arrays.items():
        np.testing.assert_array_equal(got.as_numpy(f"out_{kind}"), array, err_msg=kind)


def test_typed_values_out_of_range_are_refused_naming_the_element(server):
    request = service_pb2.ModelInferRequest(model_name="typed")
    for kind in TYPED_FIELDS:
        array = values(kind, seed=1)
        spec = request.inputs.add(name=f"in_{kind}", datatype=kind, shape=array.shape)
        getattr(spec.contents, TYPED_FIELDS[kind]).extend(array.reshape(-1).tolist())
    request.inputs[5].contents.int_contents[4] = 300  # INT8
    channel, service = stub(server)
    with channel, pytest.raises(grpc.RpcError) as caught:
        service.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        "input 'in_INT8': element 4 of contents.int_contents is 300, out of the range of "
        "INT8 [-128, 127]"
    )


# -- errors: REST's messages, gRPC's codes ------------------------------------------------------


def rest_error(server: LiveGrpcServer, model: str, spec: dict[str, Any]) -> tuple[int, str]:
    response = httpx.post(f"http://{server.url}/v2/models/{model}/infer", json={"inputs": [spec]})
    return response.status_code, response.json()["error"]


@pytest.mark.parametrize(
    ("model", "name", "shape", "kind", "status", "code"),
    [
        ("nope", "x", [1, 4], "FP32", 404, "NOT_FOUND"),  # unknown model
        ("mlp", "x", [2, 5], "FP32", 400, "INVALID_ARGUMENT"),  # bad shape
        ("mlp", "x", [1, 4], "FP64", 400, "INVALID_ARGUMENT"),  # bad datatype
        ("mlp", "w", [1, 4], "FP32", 400, "INVALID_ARGUMENT"),  # unknown input
    ],
    ids=["unknown-model", "bad-shape", "bad-datatype", "unknown-input"],
)
def test_errors_carry_the_rest_message_with_a_grpc_code(
    server, client, model, name, shape, kind, status, code
):
    array = np.zeros(shape, NUMPY_TYPES[kind])
    rest_status, rest_message = rest_error(
        server, model, {"name": name, "shape": shape, "datatype": kind, "data": array.tolist()}
    )
    assert rest_status == status
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [tensor(name, array, kind)])
    assert caught.value.status() == f"StatusCode.{code}"
    assert caught.value.message() == rest_message
    assert client.infer("mlp", [tensor("x", rows(1, 0))]).as_numpy("y").shape == (1, 3)


def test_every_error_kind_has_a_grpc_code():
    assert set(GRPC_STATUS) == set(ErrorKind)
    assert GRPC_STATUS[ErrorKind.UNAVAILABLE] == grpc.StatusCode.UNAVAILABLE


def test_a_full_model_answers_unavailable_with_the_rest_message(server, client):
    """slow runs one inference and queues one: a third is refused at once."""
    x = slow_input()
    outcomes: list[Any] = []

    def infer() -> None:
        other = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            outcomes.append(other.infer("slow", [tensor("x", x)]).as_numpy("y").shape)
        except InferenceServerException as exc:
            outcomes.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=infer) for _ in range(2)]
    for thread in threads:
        thread.start()
    in_flight = "aioinfer_inference_requests_in_flight"
    wait_until(lambda: metric(server.url, in_flight, model="slow") == 2, 60, "two in flight")
    with pytest.raises(InferenceServerException) as caught:
        client.infer("slow", [tensor("x", x)])
    for thread in threads:
        thread.join(120)
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert caught.value.message() == (
        "model 'slow' is at capacity: 1 inferences running and 1 waiting (the queue limit)"
    )
    assert outcomes == [(SLOW_ROWS, WIDE)] * 2


# -- sequences -------------------------------------------------------------------------------------


def test_sequences_keep_state_per_id_and_end(client):
    def step(value: float, sequence_id: int | str, **flags: bool) -> list[float]:
        x = np.full((1, 2), value, np.float32)
        result = client.infer("accumulator", [tensor("x", x)], sequence_id=sequence_id, **flags)
        return result.as_numpy("total").reshape(-1).tolist()

    assert step(1, 41, sequence_start=True) == [1, 1]
    assert step(10, "forty-two", sequence_start=True) == [10, 10]
    assert step(2, 41) == [3, 3]
    assert step(5, "forty-two") == [15, 15]
    assert step(4, 41, sequence_end=True) == [7, 7]
    with pytest.raises(InferenceServerException, match=r"sequence 41 .* is not active") as caught:
        step(1, 41)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert step(1, 41, sequence_start=True) == [1, 1]  # a new sequence, from zero
    assert step(1, "forty-two", sequence_end=True) == [16, 16]


def test_a_sequence_past_max_sequences_is_refused_with_the_rest_message(server, client):
    x = np.ones((1, 2), np.float32)
    client.infer("one_sequence", [tensor("x", x)], sequence_id=1, sequence_start=True)
    body = {
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 1]}],
        "parameters": {"sequence_id": 2, "sequence_start": True},
    }
    response = httpx.post(f"http://{server.url}/v2/models/one_sequence/infer", json=body)
    assert response.status_code == 503
    with pytest.raises(InferenceServerException) as caught:
        client.infer("one_sequence", [tensor("x", x)], sequence_id=2, sequence_start=True)
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert caught.value.message() == response.json()["error"]
    assert "max_sequences 1" in caught.value.message()
    client.infer("one_sequence", [tensor("x", x)], sequence_id=1, sequence_end=True)
    result = client.infer("one_sequence", [tensor("x", x)], sequence_id=2, sequence_start=True)
    assert result.as_numpy("total").tolist() == [[1.0, 1.0]]


# -- streaming ---------------------------------------------------------------------------------


def test_stream_answers_in_order_with_errors_in_line_and_a_sequence(server):
    answers: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        if len(answers) == 7:
            done.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback)
    inputs = [rows(1, seed) for seed in range(3)]
    for index, x in enumerate(inputs):
        client.async_stream_infer("mlp", [tensor("x", x)], request_id=f"m{index}")
    client.async_stream_infer("nope", [tensor("x", inputs[0])], request_id="bad")
    for index, (value, flags) in enumerate(
        [(1, {"sequence_start": True}), (2, {}), (3, {"sequence_end": True})]
    ):
        x = np.full((1, 2), value, np.float32)
        client.async_stream_infer(
            "accumulator", [tensor("x", x)], request_id=f"s{index}", sequence_id=7, **flags
        )
    assert done.wait(60), answers
    client.stop_stream()
    client.close()
    model = mlp_model(seed=1)
    for index, x in enumerate(inputs):
        result, error = answers[index]
        assert error is None and result.get_response().id == f"m{index}"
        expected = reference_outputs(model, {"x": x})[0]
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=RTOL, atol=ATOL)
    result, error = answers[3]
    assert result is None and "unknown model: 'nope'" in error.message()
    totals = [answers[4 + i][0].as_numpy("total").reshape(-1).tolist() for i in range(3)]
    assert totals == [[1, 1], [3, 3], [6, 6]]
    assert [answers[4 + i][0].get_response().id for i in range(3)] == ["s0", "s1", "s2"]


@pytest.mark.anyio
async def test_aio_client_infer_and_stream(server):
    client = aioclient.InferenceServerClient(server.grpc_url)
    try:
        assert await client.is_server_ready()
        x = rows(2, seed=5)
        result = await client.infer("mlp", [tensor("x", x)], request_id="a1")
        expected = reference_outputs(mlp_model(seed=1), {"x": x})
        np.testing.assert_allclose(result.as_numpy("z"), expected[1], rtol=RTOL, atol=ATOL)

        async def requests() -> Any:
            for value in (5, 6, 7):
                yield {
                    "model_name": "accumulator",
                    "inputs": [tensor("x", np.full((1, 2), value, np.float32))],
                    "sequence_id": 99,
                    "sequence_start": value == 5,
                    "sequence_end": value == 7,
                    "request_id": str(value),
                }

        totals = []
        async for result, error in client.stream_infer(requests()):
            assert error is None
            totals.append((result.get_response().id, result.as_numpy("total")[0, 0].item()))
        assert totals == [("5", 5.0), ("6", 11.0), ("7", 18.0)]
    finally:
        await client.close()


# -- cancellation ------------------------------------------------------------------------------


def slow_input(rows: int = SLOW_ROWS) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, WIDE)).astype(np.float32)


def timed_slow_infer(client: grpcclient.InferenceServerClient, rows: int = SLOW_ROWS) -> float:
    """Seconds of one inference of ``rows`` rows on slow (which computes one at a time:
    a row waits for any inference still computing)."""
    start = time.perf_counter()
    assert client.infer("slow", [tensor("x", slow_input(rows))]).as_numpy("y").shape[0] == rows
    return time.perf_counter() - start


async def cancelled_mid_compute(
    server: LiveGrpcServer, client: grpcclient.InferenceServerClient, full: float, start: Any
) -> float:
    """Start a slow inference with ``start()`` (a task), cancel it once it computes:
    the seconds until slow answered one row after it (it computes one inference at a
    time, so the row waits for the cancelled compute unless it stopped)."""
    in_flight = "aioinfer_inference_requests_in_flight"

    def gauge() -> float:
        return metric(server.url, in_flight, model="slow")

    task = asyncio.ensure_future(start())
    while await asyncio.to_thread(gauge) != 1:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    await asyncio.sleep(full / 10)
    task.cancel()
    cancelled = time.perf_counter()
    await asyncio.to_thread(timed_slow_infer, client, 1)
    return time.perf_counter() - cancelled


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["infer", "stream"])
async def test_a_cancelled_call_stops_its_compute(server, client, how):
    full = timed_slow_infer(client)
    cancelled = "aioinfer_inference_failures_total"
    before = metric(server.url, cancelled, model="slow", reason="cancelled")
    aio = aioclient.InferenceServerClient(server.grpc_url)

    async def infer() -> Any:
        return await aio.infer("slow", [tensor("x", slow_input())])

    async def stream() -> Any:
        async def one() -> Any:
            yield {"model_name": "slow", "inputs": [tensor("x", slow_input())]}
            await asyncio.sleep(3600)  # the stream stays open until cancelled

        async for answer in aio.stream_infer(one()):
            return answer

    try:
        work = infer if how == "infer" else stream
        stopped = await cancelled_mid_compute(server, client, full, work)
    finally:
        await aio.close()
    # The inference stops between kernels: far sooner than it would have finished.
    assert stopped < full / 2, (stopped, full)
    after = metric(server.url, cancelled, model="slow", reason="cancelled")
    assert after == before + 1
    assert timed_slow_infer(client) > 0  # and the model serves the next request


def test_a_deadline_that_passes_stops_the_compute(server, client):
    full = timed_slow_infer(client)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("slow", [tensor("x", slow_input())], client_timeout=full / 5)
    assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    stopped = timed_slow_infer(client, 1)  # waits for the compute unless it stopped
    assert stopped < full / 2, (stopped, full)
    assert timed_slow_infer(client) > 0


# -- one service behind both transports ---------------------------------------------------------


def test_rest_and_grpc_share_the_models_statistics(server, client):
    requests = "aioinfer_inference_requests_total"
    before = metric(server.url, requests, model="mlp", version="2")
    x = rows(1, seed=9)
    client.infer("mlp", [tensor("x", x)])
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.tolist()}]}
    assert httpx.post(f"http://{server.url}/v2/models/mlp/infer", json=body).status_code == 200
    assert metric(server.url, requests, model="mlp", version="2") == before + 2
