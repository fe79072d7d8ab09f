"""The flows of tritonclient's gRPC example scripts, with the unmodified
``tritonclient.grpc`` and ``tritonclient.grpc.aio``, against a live server of the
equivalent ONNX models (tests/serving/triton_models.py).

Each test makes the calls and checks of one script (simple_grpc_infer_client.py,
simple_grpc_async_infer_client.py, simple_grpc_aio_infer_client.py,
simple_grpc_string_infer_client.py, simple_grpc_sequence_stream_infer_client.py,
simple_grpc_sequence_sync_infer_client.py, simple_grpc_model_control.py,
simple_grpc_shm_client.py, simple_grpc_shm_string_client.py), written here in the tests'
own words.

Of these flows, the ones that call no extension (async, string, the two sequence flows)
passed before the extensions came to gRPC; they stay here as the scripts' acceptance
flows. The async case runs its own asyncio loop: grpc.aio is asyncio's.
"""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from tests.serving.grpc.live import LiveGrpcServer
from tests.serving.triton_models import write_triton_repository

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), np.int32)
SEQUENCE_VALUES = [11, 7, 5, 3, 2, 0, 1]


@pytest.fixture(scope="module")
def triton_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_triton_repository(tmp_path_factory.mktemp("triton_grpc_repo"))


@pytest.fixture(scope="module")
def server(triton_repository: Path) -> Iterator[LiveGrpcServer]:
    with LiveGrpcServer(triton_repository) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveGrpcServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def simple_inputs(module: Any = grpcclient) -> list[Any]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(INPUT1)
    return inputs


def simple_outputs(module: Any = grpcclient) -> list[Any]:
    return [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]


def check_sum_and_difference(result: Any) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INPUT0 - INPUT1)


def test_simple_grpc_infer_client_flow(client):
    result = client.infer(
        "simple",
        simple_inputs(),
        outputs=simple_outputs(),
        headers={"test": "1"},
        compression_algorithm="gzip",
    )
    statistics = client.get_inference_statistics(model_name="simple")
    assert len(statistics.model_stats) == 1
    assert statistics.model_stats[0].inference_stats.success.count >= 1
    check_sum_and_difference(result)
    check_sum_and_difference(client.infer("simple", simple_inputs(), outputs=None))
    with pytest.raises(InferenceServerException) as error:
        client.infer("wrong_model_name", simple_inputs())
    assert error.value.message().startswith("Request for unknown model")


def test_simple_grpc_async_infer_client_flow(client):
    answers: queue.Queue[Any] = queue.Queue()

    def callback(results: queue.Queue[Any], result: Any, error: Any) -> None:
        results.put(error or result)

    client.async_infer(
        "simple", simple_inputs(), partial(callback, answers), outputs=simple_outputs()
    )
    answer = answers.get(timeout=60)
    assert not isinstance(answer, InferenceServerException), answer
    check_sum_and_difference(answer)


def test_simple_grpc_aio_infer_client_flow(server):
    async def main() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            result = await client.infer(
                "simple",
                simple_inputs(aioclient),
                outputs=simple_outputs(aioclient),
                headers={"test": "1"},
            )
            statistics = await client.get_inference_statistics(model_name="simple")
            assert len(statistics.model_stats) == 1
            check_sum_and_difference(result)
            both = await asyncio.gather(
                client.infer("simple", simple_inputs(aioclient), outputs=None),
                client.infer("simple", simple_inputs(aioclient), outputs=None),
            )
            for each in both:
                check_sum_and_difference(each)

    asyncio.run(main())


def test_simple_grpc_string_infer_client_flow(client):
    as_strings = np.vectorize(lambda x: str(x).encode(), otypes=[object])
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "BYTES"),
        grpcclient.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(as_strings(INPUT0))
    inputs[1].set_data_from_numpy(as_strings(INPUT1))
    result = client.infer("simple_string", inputs, outputs=simple_outputs())
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == list((INPUT0 + INPUT1)[0])
    assert [int(x) for x in result.as_numpy("OUTPUT1")[0]] == list((INPUT0 - INPUT1)[0])

    def identity(array: np.ndarray) -> np.ndarray:
        tensor = grpcclient.InferInput("INPUT0", list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        wanted = [grpcclient.InferRequestedOutput("OUTPUT0")]
        return client.infer("simple_identity", [tensor], outputs=wanted).as_numpy("OUTPUT0")

    null_chars = np.array([b"he\x00llo"] * 16, dtype=object).reshape(1, 16)
    assert np.array_equal(identity(null_chars), null_chars)
    blobs = np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape(1, 16)
    assert np.array_equal(np.char.encode(identity(blobs).astype(str)), blobs)


def sequence_values(first: int, sign: int) -> list[int]:
    return [first] + [sign * value for value in SEQUENCE_VALUES]


def expected_outputs(first: int, sign: int) -> list[int]:
    """What the script expects of Triton's ``simple_sequence``: the first value plus 1
    (a fresh sequence), then the values as sent."""
    return [first + 1] + [sign * value for value in SEQUENCE_VALUES]


SEQUENCES = [(1000, 0, 1), (1001, 100, -1), (str(uuid.uuid4()), 20, -1)]
"""(sequence id, first value, sign) of the scripts' three sequences: two integer ids and
a string id."""


def sequence_input(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    return [tensor]


def test_simple_grpc_sequence_stream_infer_client_flow(server):
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for sequence_id, first, sign in SEQUENCES:
            values = sequence_values(first, sign)
            for index, value in enumerate(values, start=1):
                client.async_stream_infer(
                    "simple_sequence",
                    sequence_input(value),
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sequence_id}_{index}",
                    sequence_id=sequence_id,
                    sequence_start=index == 1,
                    sequence_end=index == len(values),
                )
        received: dict[str, list[int]] = {str(sequence_id): [] for sequence_id, _, _ in SEQUENCES}
        for _ in range(len(SEQUENCES) * (len(SEQUENCE_VALUES) + 1)):
            answer = answers.get(timeout=60)
            assert not isinstance(answer, InferenceServerException), answer
            sequence_id = answer.get_response().id.rsplit("_", 1)[0]
            received[sequence_id].append(int(answer.as_numpy("OUTPUT")[0][0]))
    for sequence_id, first, sign in SEQUENCES:
        assert received[str(sequence_id)] == expected_outputs(first, sign), sequence_id


def test_simple_grpc_sequence_sync_infer_client_flow(client):
    for sequence_id, first, sign in SEQUENCES:
        values = sequence_values(first, sign)
        results = []
        for index, value in enumerate(values, start=1):
            result = client.infer(
                "simple_sequence",
                sequence_input(value),
                outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                sequence_id=sequence_id,
                sequence_start=index == 1,
                sequence_end=index == len(values),
            )
            results.append(int(result.as_numpy("OUTPUT")[0][0]))
        assert results == expected_outputs(first, sign), sequence_id


@pytest.fixture()
def explicit_server(triton_repository: Path) -> Iterator[LiveGrpcServer]:
    with LiveGrpcServer(triton_repository, model_control_mode="explicit") as live:
        yield live


def test_simple_grpc_model_control_flow(explicit_server):
    with grpcclient.InferenceServerClient(explicit_server.grpc_url) as client:
        assert len(client.get_model_repository_index().models) == 7
        client.load_model("simple")
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as error:
            client.load_model(
                "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}'
            )
        assert "failed to load" in error.value.message()
        client.load_model("simple", config='{"max_batch_size":"16"}')
        assert client.get_model_config("simple").config.max_batch_size == 16
        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as error:
            client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "model files in the request are not supported" in error.value.message()
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as error:
            client.load_model("wrong_model_name")
        assert "failed to load" in error.value.message()


def shm_key(stem: str) -> str:
    return f"/{stem}_{uuid.uuid4().hex[:12]}"  # unique: tests may run side by side


def test_simple_grpc_shm_client_flow(client):
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    input0, input1 = INPUT0[0], INPUT1[0]
    size = input0.nbytes
    output_key, input_key = shm_key("output_simple"), shm_key("input_simple")
    output_handle = shm.create_shared_memory_region("output_data", output_key, size * 2)
    input_handle = shm.create_shared_memory_region("input_data", input_key, size * 2)
    try:
        client.register_system_shared_memory("output_data", output_key, size * 2)
        shm.set_shared_memory_region(input_handle, [input0])
        shm.set_shared_memory_region(input_handle, [input1], offset=size)
        client.register_system_shared_memory("input_data", input_key, size * 2)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = simple_outputs()
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        result = client.infer(model_name="simple", inputs=inputs, outputs=outputs)
        output0 = result.get_output("OUTPUT0")
        output1 = result.get_output("OUTPUT1")
        assert output0 is not None and output1 is not None
        dtype = utils.triton_to_np_dtype(output0.datatype)
        sums = shm.get_contents_as_numpy(output_handle, dtype, output0.shape)
        differences = shm.get_contents_as_numpy(
            output_handle, utils.triton_to_np_dtype(output1.datatype), output1.shape, offset=size
        )
        np.testing.assert_array_equal(sums[0], input0 + input1)
        np.testing.assert_array_equal(differences[0], input0 - input1)
        status = client.get_system_shared_memory_status()
        assert sorted(status.regions) == ["input_data", "output_data"]
        client.unregister_system_shared_memory()
        assert len(client.get_system_shared_memory_status().regions) == 0
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(input_handle)
        shm.destroy_shared_memory_region(output_handle)


def test_simple_grpc_shm_string_client_flow(client):
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    as_strings = np.vectorize(lambda x: str(x).encode(), otypes=[object])
    input0, input1 = as_strings(INPUT0[0]), as_strings(INPUT1[0])
    expected = [as_strings(INPUT0[0] + INPUT1[0]), as_strings(INPUT0[0] - INPUT1[0])]
    serialized = [utils.serialize_byte_tensor(a) for a in (input0, input1)]
    in_sizes = [utils.serialized_byte_size(s) for s in serialized]
    out_sizes = [utils.serialized_byte_size(utils.serialize_byte_tensor(a)) for a in expected]
    handles = []
    try:
        for index, size in enumerate(out_sizes):
            key = shm_key(f"output{index}_simple")
            handles.append(shm.create_shared_memory_region(f"output{index}_data", key, size))
            client.register_system_shared_memory(f"output{index}_data", key, size)
        for index, (size, data) in enumerate(zip(in_sizes, serialized)):
            key = shm_key(f"input{index}_simple")
            handle = shm.create_shared_memory_region(f"input{index}_data", key, size)
            handles.append(handle)
            shm.set_shared_memory_region(handle, [data])
            client.register_system_shared_memory(f"input{index}_data", key, size)
        inputs = []
        for index, size in enumerate(in_sizes):
            tensor = grpcclient.InferInput(f"INPUT{index}", [1, 16], "BYTES")
            tensor.set_shared_memory(f"input{index}_data", size)
            inputs.append(tensor)
        outputs = simple_outputs()
        for index, size in enumerate(out_sizes):
            outputs[index].set_shared_memory(f"output{index}_data", size)
        result = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
        for index, values in enumerate(expected):
            output = result.get_output(f"OUTPUT{index}")
            assert output is not None
            dtype = utils.triton_to_np_dtype(output.datatype)
            written = shm.get_contents_as_numpy(handles[index], dtype, output.shape)
            assert list(written[0]) == list(values)
        assert len(client.get_system_shared_memory_status().regions) == 4
        client.unregister_system_shared_memory()
    finally:
        client.unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
