"""Triton's extensions over gRPC, against a live server with both transports and the
unmodified ``tritonclient.grpc``: the answers equal REST's (the same service methods,
parsed into Triton's messages), the refusals carry REST's message with a gRPC code, and
shared-memory tensors are read and written in place as over REST."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.serving.grpc.live import LiveGrpcServer
from tests.serving.triton_models import write_triton_repository


@pytest.fixture(scope="module")
def triton_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_triton_repository(tmp_path_factory.mktemp("grpc_ext"))


@pytest.fixture(scope="module")
def server(triton_repository: Path) -> Iterator[LiveGrpcServer]:
    with LiveGrpcServer(triton_repository) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveGrpcServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(server: LiveGrpcServer) -> Iterator[Any]:
    """The bare generated stub: for messages tritonclient does not send."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """(gRPC status, message) of the error a tritonclient call raises."""
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value.status()), caught.value.message()


def rest(server: LiveGrpcServer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, f"http://{server.url}{path}", timeout=60, **kwargs)


def simple_tensors(rows: int = 1, seed: int = 0) -> list[grpcclient.InferInput]:
    rng = np.random.default_rng(seed)
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(rng.integers(-100, 100, (rows, 16), dtype=np.int32))
        tensors.append(tensor)
    return tensors


# -- statistics ---------------------------------------------------------------------------


def test_statistics_count_over_grpc_and_equal_rests(server, client):
    def stats() -> Any:
        (entry,) = client.get_inference_statistics("simple").model_stats
        return entry

    before = stats()
    for rows in (1, 3):
        client.infer("simple", simple_tensors(rows))
    refusal(client.infer, "simple", simple_tensors()[:1])  # INPUT1 missing: a failure
    after = stats()
    assert (after.name, after.version) == ("simple", "1")
    success, old = after.inference_stats.success, before.inference_stats.success
    assert success.count - old.count == 2 and success.ns > old.ns
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1
    assert after.inference_count - before.inference_count == 4  # rows
    assert after.last_inference > 0 and after.last_inference >= before.last_inference
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert getattr(after.inference_stats, phase).count == success.count
    # The same service method answers REST: the same figures in Triton's message.
    for path, name, version in (
        ("/v2/models/simple/stats", "simple", ""),
        ("/v2/models/simple/versions/1/stats", "simple", "1"),
        ("/v2/models/stats", "", ""),
    ):
        over_rest = rest(server, "GET", path).json()
        over_grpc = client.get_inference_statistics(name, version)
        assert over_grpc == json_format.ParseDict(over_rest, service_pb2.ModelStatisticsResponse())
    assert len(client.get_inference_statistics().model_stats) == 7


def test_statistics_of_an_unknown_model_or_version_are_not_found(server, client):
    for name, version, path in (
        ("nope", "", "/v2/models/nope/stats"),
        ("simple", "9", "/v2/models/simple/versions/9/stats"),
    ):
        status, message = refusal(client.get_inference_statistics, name, version)
        assert status == "StatusCode.NOT_FOUND"
        assert message == rest(server, "GET", path).json()["error"]
        assert message.startswith(f"Request for unknown model: '{name}'")


# -- model configuration ------------------------------------------------------------------


def test_model_config_is_tritons_message(server, client):
    config = client.get_model_config("simple").config
    assert config.name == "simple" and config.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", model_config_pb2.TYPE_INT32, [16]),
        ("INPUT1", model_config_pb2.TYPE_INT32, [16]),
    ]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count >= 1
    as_json = client.get_model_config("simple", as_json=True)["config"]
    assert as_json["max_batch_size"] == 8 and as_json["input"][0]["data_type"] == "TYPE_INT32"
    strings = client.get_model_config("simple_string").config
    assert strings.max_batch_size == 0 and not strings.HasField("dynamic_batching")
    assert strings.input[0].data_type == model_config_pb2.TYPE_STRING
    assert list(strings.input[0].dims) == [-1, 16]  # no batching: the whole shape
    sequence = client.get_model_config("simple_sequence", "1").config
    assert [t.name for t in sequence.input] == ["INPUT"]  # the state is inside
    assert sequence.sequence_batching.max_sequence_idle_microseconds == 60_000_000
    for name in ("simple", "simple_string", "simple_sequence", "simple_int8"):
        over_rest = rest(server, "GET", f"/v2/models/{name}/config").json()
        expected = json_format.ParseDict(over_rest, model_config_pb2.ModelConfig())
        assert client.get_model_config(name).config == expected, name
    status, message = refusal(client.get_model_config, "nope")
    assert status == "StatusCode.NOT_FOUND"
    assert message == rest(server, "GET", "/v2/models/nope/config").json()["error"]


# -- model repository ---------------------------------------------------------------------


def test_none_mode_refuses_load_and_unload_with_rests_message(server, client):
    for call, action in ((client.load_model, "load"), (client.unload_model, "unload")):
        status, message = refusal(call, "simple")
        assert status == "StatusCode.UNAVAILABLE"
        assert message.startswith("explicit model load / unload is not allowed")
        path = f"/v2/repository/models/simple/{action}"
        assert message == rest(server, "POST", path).json()["error"]
    assert client.is_model_ready("simple")
    index = client.get_model_repository_index().models
    assert len(index) == 7 and {entry.state for entry in index} == {"READY"}
    over_rest = rest(server, "POST", "/v2/repository/index").json()
    assert client.get_model_repository_index() == json_format.ParseDict(
        {"models": over_rest}, service_pb2.RepositoryIndexResponse()
    )


@pytest.fixture()
def explicit(triton_repository: Path) -> Iterator[LiveGrpcServer]:
    with LiveGrpcServer(
        triton_repository, model_control_mode="explicit", load_models=["simple"]
    ) as live:
        yield live


def test_explicit_mode_loads_reloads_and_unloads(explicit):
    with (
        grpcclient.InferenceServerClient(explicit.grpc_url) as client,
        grpc.insecure_channel(explicit.grpc_url) as channel,
    ):
        states = {e.name: e.state for e in client.get_model_repository_index().models}
        assert states["simple"] == "READY" and states["simple_string"] == "UNAVAILABLE"
        ready = client.get_model_repository_index(as_json=True)
        assert {"name": "simple_string", "state": "UNAVAILABLE", "reason": "unloaded"} in (
            ready["models"]
        )
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        only_ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
        assert [entry.name for entry in only_ready.models] == ["simple"]

        status, message = refusal(client.get_model_metadata, "simple_string")
        assert status == "StatusCode.NOT_FOUND" and "not loaded" in message
        client.load_model("simple_string")
        assert client.is_model_ready("simple_string")
        client.unload_model("simple_string")
        assert not client.is_model_ready("simple_string")
        client.unload_model("simple_string")  # not loaded: no error
        status, message = refusal(client.unload_model, "nope")
        assert status == "StatusCode.INVALID_ARGUMENT" and "failed to unload 'nope'" in message

        for config in ('{"max_batch_size": "many"}', '{"no_such_key": 1}', "[1]"):
            status, message = refusal(client.load_model, "simple", config=config)
            assert status == "StatusCode.INVALID_ARGUMENT"
            assert message.startswith("failed to load 'simple'")
        assert client.get_model_config("simple").config.max_batch_size == 8  # kept
        client.load_model("simple", config='{"max_batch_size": 0}')
        assert client.get_model_config("simple").config.max_batch_size == 0
        assert client.infer("simple", simple_tensors(2)).as_numpy("OUTPUT0").shape == (2, 16)

        not_a_string = service_pb2.RepositoryModelLoadRequest(model_name="simple")
        not_a_string.parameters["config"].int64_param = 4
        with pytest.raises(grpc.RpcError) as caught:
            stub.RepositoryModelLoad(not_a_string)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'config' parameter must be a string_param" in caught.value.details()
        status, message = refusal(client.load_model, "simple", files={"file:1/model.onnx": b"x"})
        assert status == "StatusCode.INVALID_ARGUMENT"
        body = {"parameters": {"file:1/model.onnx": "eA=="}}
        path = "/v2/repository/models/simple/load"
        over_rest = httpx.post(f"http://{explicit.url}{path}", json=body).json()["error"]
        assert message == over_rest
        assert client.is_model_ready("simple")


# -- system shared memory -----------------------------------------------------------------


@pytest.fixture()
def region() -> Iterator[tuple[str, Any]]:
    """A 256-byte POSIX shared-memory object: its key and tritonclient's handle."""
    key = f"/aioinfer_grpc_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("fixture", key, 256)
    try:
        yield key, handle
    finally:
        shm.destroy_shared_memory_region(handle)


def test_register_status_and_unregister(server, client, region):
    key, _ = region
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("data", key, 128, offset=64)
    try:
        status = client.get_system_shared_memory_status("data").regions["data"]
        assert (status.name, status.key, status.offset, status.byte_size) == ("data", key, 64, 128)
        # One registry behind both transports: REST sees the region gRPC registered.
        over_rest = rest(server, "GET", "/v2/systemsharedmemory/status").json()
        assert over_rest == [{"name": "data", "key": key, "offset": 64, "byte_size": 128}]
        code, message = refusal(client.register_system_shared_memory, "data", key, 8)
        assert code == "StatusCode.INVALID_ARGUMENT" and "'data' already in manager" in message
        code, message = refusal(client.get_system_shared_memory_status, "nope")
        assert code == "StatusCode.INVALID_ARGUMENT"
        path = "/v2/systemsharedmemory/region/nope/status"
        assert message == rest(server, "GET", path).json()["error"]
        for bad_key, words in (
            ("../../etc/passwd", "is not the name of a POSIX shared-memory object"),
            ("/aioinfer_missing_" + uuid.uuid4().hex, "Unable to open shared memory region"),
        ):
            code, message = refusal(client.register_system_shared_memory, "r", bad_key, 8)
            assert code == "StatusCode.INVALID_ARGUMENT" and words in message, message
        code, message = refusal(client.register_system_shared_memory, "r", key, 512)
        assert code == "StatusCode.INVALID_ARGUMENT" and "does not fit the 256 bytes" in message
        client.unregister_system_shared_memory("data")
        client.unregister_system_shared_memory("data")  # idempotent, as Triton's
        assert len(client.get_system_shared_memory_status().regions) == 0
    finally:
        client.unregister_system_shared_memory()


def test_shared_and_inline_tensors_in_one_request(client, region):
    """INPUT0 from the region, INPUT1 in raw_input_contents; OUTPUT0 into the region,
    OUTPUT1 in the response, where tritonclient finds it by its index."""
    key, handle = region
    client.register_system_shared_memory("io", key, 256)
    try:
        first = np.arange(16, dtype=np.int32).reshape(1, 16)
        second = np.full((1, 16), 7, np.int32)
        shm.set_shared_memory_region(handle, [first])
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("io", 64)
        inputs[1].set_data_from_numpy(second)
        outputs = [
            grpcclient.InferRequestedOutput("OUTPUT0"),
            grpcclient.InferRequestedOutput("OUTPUT1"),
        ]
        outputs[0].set_shared_memory("io", 64, offset=128)
        result = client.infer("simple", inputs, outputs=outputs)
        output0 = result.get_output("OUTPUT0")
        assert output0.parameters["shared_memory_region"].string_param == "io"
        assert output0.parameters["shared_memory_byte_size"].int64_param == 64
        assert output0.parameters["shared_memory_offset"].int64_param == 128
        assert list(output0.shape) == [1, 16] and output0.datatype == "INT32"
        written = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128)
        np.testing.assert_array_equal(written, first + second)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), first - second)
    finally:
        client.unregister_system_shared_memory()


def test_tensor_windows_are_checked_with_rests_messages(client, stub, region):
    key, handle = region
    client.register_system_shared_memory("data", key, 128, offset=64)
    try:

        def infer_with(offset: int, size: int, name: str = "data", out: int = 64) -> Any:
            inputs = []
            for index, tensor_name in enumerate(("INPUT0", "INPUT1")):
                tensor = grpcclient.InferInput(tensor_name, [1, 16], "INT32")
                tensor.set_shared_memory(name, size, offset=offset + 64 * index)
                inputs.append(tensor)
            wanted = grpcclient.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory("data", out)
            return client.infer("simple", inputs, outputs=[wanted])

        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)], offset=64)
        shm.set_shared_memory_region(handle, [np.full(16, 5, np.int32)], offset=128)
        infer_with(0, 64)
        written = shm.get_contents_as_numpy(handle, np.int32, [16], offset=64)
        np.testing.assert_array_equal(written, np.arange(16) + 5)
        for args, words in (
            ((64, 64), "invalid offset + byte size for shared memory region 'data'"),
            ((0, 60), "unexpected total byte size 60"),
            ((0, 64, "nope"), "Unable to find system shared memory region: 'nope'"),
            ((0, 64, "data", 32), "should be at least 64 bytes"),
        ):
            code, message = refusal(infer_with, *args)
            assert code == "StatusCode.INVALID_ARGUMENT" and words in message, message

        request = service_pb2.ModelInferRequest(model_name="simple")
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            request.raw_input_contents.append(np.zeros(16, np.int32).tobytes())
        request.inputs[0].parameters["shared_memory_region"].string_param = "data"
        request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 64
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith(
            "raw_input_contents has 2 entries for 1 inputs not in shared memory"
        )
        request.inputs[0].parameters["shared_memory_byte_size"].int64_param = -1
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
        assert "shared_memory_byte_size must be an integer >= 0" in caught.value.details()
    finally:
        client.unregister_system_shared_memory()


def test_cuda_shared_memory_is_answered_as_over_rest(server, client):
    client.unregister_cuda_shared_memory()  # nothing registered: no error (as Triton)
    assert len(client.get_cuda_shared_memory_status().regions) == 0
    code, message = refusal(client.register_cuda_shared_memory, "gpu", b"\x00" * 64, 0, 8)
    assert code == "StatusCode.INVALID_ARGUMENT"
    assert "CUDA shared memory is not supported" in message
    body = {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8}
    path = "/v2/cudasharedmemory/region/gpu/register"
    assert message == rest(server, "POST", path, json=body).json()["error"]
