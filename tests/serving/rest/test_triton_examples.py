"""The flows of tritonclient's HTTP example scripts, with the unmodified tritonclient,
against a live server of the equivalent ONNX models (tests/serving/triton_models.py).

Each test makes the calls and checks of one script (simple_http_infer_client.py,
simple_http_async_infer_client.py, simple_http_aio_infer_client.py,
simple_http_string_infer_client.py, simple_http_sequence_sync_infer_client.py,
simple_http_model_control.py, simple_http_shm_client.py, simple_http_shm_string_client.py),
written here in the tests' own words.

Of these flows, the ones that need no extension (async, string, sequence) passed before
the extensions existed; they stay here as the scripts' acceptance flows.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from aioinfer.serving import create_app
from tests.serving.conftest import LiveServer
from tests.serving.triton_models import write_triton_repository

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.full((1, 16), -1, np.int32)


@pytest.fixture(scope="module")
def triton_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_triton_repository(tmp_path_factory.mktemp("triton_repo"))


@pytest.fixture(scope="module")
def triton_server(triton_repository: Path) -> Iterator[LiveServer]:
    with LiveServer(create_app(triton_repository)) as live:
        yield live


@pytest.fixture(scope="module")
def client(triton_server: LiveServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(triton_server.url)


def simple_inputs(
    module: object = httpclient, first_binary: bool = False
) -> list[httpclient.InferInput]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),  # type: ignore[attr-defined]
        module.InferInput("INPUT1", [1, 16], "INT32"),  # type: ignore[attr-defined]
    ]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=first_binary)
    inputs[1].set_data_from_numpy(INPUT1, binary_data=True)
    return inputs


def simple_outputs(module: object = httpclient) -> list[httpclient.InferRequestedOutput]:
    return [
        module.InferRequestedOutput("OUTPUT0", binary_data=True),  # type: ignore[attr-defined]
        module.InferRequestedOutput("OUTPUT1", binary_data=False),  # type: ignore[attr-defined]
    ]


def check_sum_and_difference(result: httpclient.InferResult) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INPUT0 - INPUT1)


def test_simple_http_infer_client_flow(client):
    query = {"test_1": 1, "test_2": 2}
    result = client.infer("simple", simple_inputs(), outputs=simple_outputs(), query_params=query)
    statistics = client.get_inference_statistics(model_name="simple")
    assert len(statistics["model_stats"]) == 1
    check_sum_and_difference(result)
    check_sum_and_difference(client.infer("simple", simple_inputs(), query_params=query))
    with pytest.raises(InferenceServerException) as error:
        client.infer("wrong_model_name", simple_inputs(), outputs=simple_outputs())
    assert error.value.message().startswith("Request for unknown model")


def test_simple_http_async_infer_client_flow(triton_server):
    client = httpclient.InferenceServerClient(triton_server.url, concurrency=4)
    try:
        outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        inputs = simple_inputs(first_binary=True)
        pending = [client.async_infer("simple", inputs, outputs=outputs) for _ in range(4)]
        for request in pending:
            check_sum_and_difference(request.get_result())
    finally:
        client.close()


def test_simple_http_aio_infer_client_flow(triton_server):
    async def main() -> None:
        client = aioclient.InferenceServerClient(triton_server.url)
        try:
            result = await client.infer(
                "simple", simple_inputs(aioclient), outputs=simple_outputs(aioclient)
            )
            statistics = await client.get_inference_statistics(model_name="simple")
            assert len(statistics["model_stats"]) == 1
            check_sum_and_difference(result)
            with pytest.raises(InferenceServerException) as error:
                await client.infer("wrong_model_name", simple_inputs(aioclient))
            assert error.value.message().startswith("Request for unknown model")
            both = await asyncio.gather(
                client.infer("simple", simple_inputs(aioclient), outputs=simple_outputs(aioclient)),
                client.infer("simple", simple_inputs(aioclient)),
            )
            for each in both:
                check_sum_and_difference(each)
        finally:
            await client.close()

    asyncio.run(main())


def test_simple_http_string_infer_client_flow(client):
    numbers0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    numbers1 = np.ones((1, 16), np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "BYTES"),
        httpclient.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    as_strings = np.vectorize(lambda x: str(x).encode(), otypes=[object])
    inputs[0].set_data_from_numpy(as_strings(numbers0), binary_data=True)
    inputs[1].set_data_from_numpy(as_strings(numbers1), binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = client.infer("simple_string", inputs, outputs=outputs)
    sums = [int(x) for x in result.as_numpy("OUTPUT0")[0]]
    differences = [int(x) for x in result.as_numpy("OUTPUT1")[0]]
    assert sums == list((numbers0 + numbers1)[0])
    assert differences == list((numbers0 - numbers1)[0])

    def identity(array: np.ndarray, binary: bool) -> np.ndarray:
        tensor = httpclient.InferInput("INPUT0", list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array, binary_data=binary)
        wanted = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        return client.infer("simple_identity", [tensor], outputs=wanted).as_numpy("OUTPUT0")

    null_chars = np.array([b"he\x00llo"] * 16, dtype=object).reshape(1, 16)
    assert np.array_equal(identity(null_chars, True), null_chars)
    as_json = identity(null_chars, False)  # strings: JSON carries text
    assert np.array_equal(np.vectorize(str.encode, otypes=[object])(as_json), null_chars)
    blobs = np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape(1, 16)
    for binary in (True, False):
        returned = identity(blobs, binary)
        assert np.array_equal(np.char.encode(returned.astype(str)), blobs)


def test_simple_http_sequence_sync_infer_client_flow(client):
    values = [11, 7, 5, 3, 2, 0, 1]

    def run_sequence(first: int, sign: int, sequence_id: int | str) -> list[int]:
        sent = [first] + [sign * value for value in values]
        results = []
        for index, value in enumerate(sent):
            tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
            result = client.infer(
                "simple_sequence",
                [tensor],
                outputs=[httpclient.InferRequestedOutput("OUTPUT")],
                sequence_id=sequence_id,
                sequence_start=index == 0,
                sequence_end=index == len(sent) - 1,
            )
            results.append(int(result.as_numpy("OUTPUT")[0][0]))
        return results

    # Sent one after the other, as the script does: the first of each sequence gets
    # 1 added (a fresh sequence state), the others pass through.
    assert run_sequence(0, 1, 1000) == [1, *values]
    assert run_sequence(100, -1, 1001) == [101, *(-v for v in values)]
    assert run_sequence(20, -1, str(uuid.uuid4())) == [21, *(-v for v in values)]


def test_simple_sequence_accumulates_per_sequence(client):
    """The model's SUM output: each sequence keeps its own running total."""

    def step(sequence_id: int, value: int, start: bool) -> int:
        tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
        result = client.infer(
            "simple_sequence", [tensor], sequence_id=sequence_id, sequence_start=start
        )
        return int(result.as_numpy("SUM")[0][0])

    assert step(7, 5, True) == 5
    assert step(8, 100, True) == 100
    assert step(7, 6, False) == 11
    assert step(8, -1, False) == 99
    assert step(7, 1, True) == 1  # a new start resets the total


@pytest.fixture()
def explicit_server(triton_repository: Path) -> Iterator[LiveServer]:
    app = create_app(triton_repository, model_control_mode="explicit")
    with LiveServer(app) as live:
        yield live


def test_simple_http_model_control_flow(explicit_server):
    client = httpclient.InferenceServerClient(explicit_server.url)
    assert len(client.get_model_repository_index()) == 7
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as error:
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert "failed to load" in error.value.message()
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple")["max_batch_size"] == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as error:
        client.load_model("wrong_model_name")
    assert "failed to load" in error.value.message()


def shm_key(stem: str) -> str:
    return f"/{stem}_{uuid.uuid4().hex[:12]}"  # unique: tests may run side by side


def test_simple_http_shm_client_flow(client):
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    input0 = np.arange(16, dtype=np.int32)
    input1 = np.ones(16, np.int32)
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
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
        ]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        result = client.infer(model_name="simple", inputs=inputs, outputs=outputs)
        output0 = result.get_output("OUTPUT0")
        output1 = result.get_output("OUTPUT1")
        assert output0 is not None and output1 is not None
        dtype = utils.triton_to_np_dtype(output0["datatype"])
        sums = shm.get_contents_as_numpy(output_handle, dtype, output0["shape"])
        differences = shm.get_contents_as_numpy(output_handle, dtype, output1["shape"], offset=size)
        np.testing.assert_array_equal(sums[0], input0 + input1)
        np.testing.assert_array_equal(differences[0], input0 - input1)
        status = client.get_system_shared_memory_status()
        assert sorted(region["name"] for region in status) == ["input_data", "output_data"]
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(input_handle)
        shm.destroy_shared_memory_region(output_handle)


def test_simple_http_shm_string_client_flow(client):
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    numbers0 = np.arange(16, dtype=np.int32)
    numbers1 = np.ones(16, np.int32)
    as_strings = np.vectorize(lambda x: str(x).encode(), otypes=[object])
    input0, input1 = as_strings(numbers0), as_strings(numbers1)
    expected_sum = as_strings(numbers0 + numbers1)
    expected_difference = as_strings(numbers0 - numbers1)
    serialized = [utils.serialize_byte_tensor(a) for a in (input0, input1)]
    in_sizes = [utils.serialized_byte_size(s) for s in serialized]
    out_sizes = [
        utils.serialized_byte_size(utils.serialize_byte_tensor(a))
        for a in (expected_sum, expected_difference)
    ]
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
            tensor = httpclient.InferInput(f"INPUT{index}", [1, 16], "BYTES")
            tensor.set_shared_memory(f"input{index}_data", size)
            inputs.append(tensor)
        outputs = []
        for index, size in enumerate(out_sizes):
            wanted = httpclient.InferRequestedOutput(f"OUTPUT{index}", binary_data=True)
            wanted.set_shared_memory(f"output{index}_data", size)
            outputs.append(wanted)
        result = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
        for index, expected in enumerate((expected_sum, expected_difference)):
            output = result.get_output(f"OUTPUT{index}")
            dtype = utils.triton_to_np_dtype(output["datatype"])
            values = shm.get_contents_as_numpy(handles[index], dtype, output["shape"])
            assert list(values[0]) == list(expected)
        assert len(client.get_system_shared_memory_status()) == 4
        client.unregister_system_shared_memory()
    finally:
        client.unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
