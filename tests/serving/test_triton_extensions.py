"""Triton's extensions in detail: statistics, model configuration, the model repository
(control modes, load, reload, unload with a drain) and system shared memory (confinement,
checks, in-place reads), over REST with tritonclient and on the service directly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from multiprocessing import shared_memory
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from aioinfer.errors import ErrorKind, ServiceError, ServingConfigError, SharedMemoryError
from aioinfer.serving import (
    InferenceRequest,
    InferenceService,
    ModelRepository,
    RequestedOutput,
    create_app,
)
from aioinfer.serving.messages import SharedInput, SharedMemoryRef
from aioinfer.serving.shared_memory import SystemSharedMemory
from tests.helpers import chain_model, scrape_metric, wait_until
from tests.serving.conftest import LiveServer, write_config, write_model
from tests.serving.triton_models import simple_model, write_triton_repository

SLOW_ROWS, SLOW_WIDTH = 256, 256


@pytest.fixture(scope="module")
def triton_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = write_triton_repository(tmp_path_factory.mktemp("triton_ext"))
    write_model(repo, "slow", 1, chain_model(300, SLOW_WIDTH, seed=3))
    write_config(repo, "slow", {"max_concurrency": 1})
    return repo


@pytest.fixture(scope="module")
def server(triton_repository: Path) -> Iterator[LiveServer]:
    with LiveServer(create_app(triton_repository)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def simple_inputs(rows: int = 1, seed: int = 0) -> list[httpclient.InferInput]:
    rng = np.random.default_rng(seed)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(rng.integers(-100, 100, (rows, 16), dtype=np.int32))
        inputs.append(tensor)
    return inputs


def message_of(call: object, *args: object, **kwargs: object) -> tuple[str, str]:
    """(HTTP status, message) of the error a tritonclient call raises."""
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(caught.value.status()), caught.value.message()


# -- server metadata ----------------------------------------------------------------------


def test_server_metadata_lists_the_extensions_implemented(client):
    extensions = set(client.get_server_metadata()["extensions"])
    assert {
        "binary_tensor_data",
        "sequence",
        "statistics",
        "model_configuration",
        "model_repository",
        "system_shared_memory",
    } <= extensions
    assert "cuda_shared_memory" not in extensions


# -- statistics ---------------------------------------------------------------------------


def stats_of(client: httpclient.InferenceServerClient, model: str) -> dict:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    return entry


def test_statistics_count_successes_failures_rows_and_times(client):
    before = stats_of(client, "simple")
    started_ms = time.time() * 1000
    for rows in (1, 3, 2):
        client.infer("simple", simple_inputs(rows))
    bad = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 16), np.int32))
    message_of(client.infer, "simple", [bad])  # INPUT1 missing: a failed request
    after = stats_of(client, "simple")
    assert (after["name"], after["version"]) == ("simple", "1")
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - old["success"]["count"] == 3
    assert stats["fail"]["count"] - old["fail"]["count"] == 1
    assert after["inference_count"] - before["inference_count"] == 6  # rows
    executions = after["execution_count"] - before["execution_count"]
    assert 1 <= executions <= 3  # batches of concurrent requests: one per request here
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == stats["success"]["count"]
        assert stats[phase]["ns"] >= 0
    assert stats["compute_infer"]["ns"] - old["compute_infer"]["ns"] > 0
    phases = sum(stats[p]["ns"] for p in ("queue", "compute_input", "compute_infer"))
    assert phases + stats["compute_output"]["ns"] <= stats["success"]["ns"] * 1.01 + 1000
    assert started_ms - 5 <= after["last_inference"] <= time.time() * 1000 + 5
    assert after["batch_stats"] == []


def test_statistics_of_every_model_of_one_and_of_a_version(client, triton_repository):
    every = client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in every} >= {
        ("simple", "1"),
        ("simple_string", "1"),
        ("slow", "1"),
    }
    fresh = stats_of(client, "simple_int64")  # never called: zeros
    assert fresh["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert fresh["last_inference"] == 0
    (versioned,) = client.get_inference_statistics("simple", "1")["model_stats"]
    assert versioned["version"] == "1"
    status, message = message_of(client.get_inference_statistics, "nope")
    assert status == "404" and message.startswith("Request for unknown model: 'nope'")


# -- model configuration ------------------------------------------------------------------


def test_model_config_of_a_batched_model(client):
    config = client.get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]),
        ("INPUT1", "TYPE_INT32", [16]),
    ]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] >= 1


def test_model_config_of_unbatched_and_stateful_models(client):
    strings = client.get_model_config("simple_string")
    assert strings["max_batch_size"] == 0 and "dynamic_batching" not in strings
    assert strings["input"][0]["data_type"] == "TYPE_STRING"
    assert strings["input"][0]["dims"] == [-1, 16]  # no batching: the whole shape
    sequence = client.get_model_config("simple_sequence", "1")
    assert [t["name"] for t in sequence["input"]] == ["INPUT"]  # the state is inside
    assert sequence["sequence_batching"]["max_sequence_idle_microseconds"] == 60_000_000
    status, message = message_of(client.get_model_config, "nope")
    assert status == "404" and "Request for unknown model: 'nope'" in message


# -- model repository ---------------------------------------------------------------------


def test_none_mode_refuses_load_and_unload_with_tritons_words(client):
    for call in (client.load_model, client.unload_model):
        status, message = message_of(call, "simple")
        assert status == "503"
        assert message.startswith("explicit model load / unload is not allowed")
        assert "--model-control-mode explicit" in message
    assert client.is_model_ready("simple")
    index = client.get_model_repository_index()
    assert len(index) == 8 and {entry["state"] for entry in index} == {"READY"}


@pytest.fixture()
def explicit(triton_repository: Path) -> Iterator[LiveServer]:
    app = create_app(triton_repository, model_control_mode="explicit", load_models=["simple"])
    with LiveServer(app) as live:
        yield live


def test_explicit_mode_loads_the_named_models_then_on_request(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    assert client.is_server_ready()
    states = {e["name"]: e["state"] for e in client.get_model_repository_index()}
    assert states["simple"] == "READY" and states["simple_string"] == "UNAVAILABLE"
    ready = httpx.post(f"http://{explicit.url}/v2/repository/index", json={"ready": True})
    assert [e["name"] for e in ready.json()] == ["simple"]
    status, message = message_of(client.get_model_metadata, "simple_string")
    assert status == "404"
    assert message.startswith("Request for unknown model: 'simple_string' is not found")
    assert "not loaded" in message
    client.load_model("simple_string")
    assert client.is_model_ready("simple_string")
    client.unload_model("simple_string")
    assert not client.is_model_ready("simple_string")
    client.unload_model("simple_string")  # not loaded: no error
    status, message = message_of(client.unload_model, "nope")
    assert status == "400" and "failed to unload 'nope'" in message


def test_a_failed_reload_keeps_the_loaded_model(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    for config in ('{"max_batch_size": "many"}', '{"no_such_key": 1}', "[1]"):
        status, message = message_of(client.load_model, "simple", config=config)
        assert status == "400" and message.startswith("failed to load 'simple'")
    assert client.is_model_ready("simple")
    assert client.get_model_config("simple")["max_batch_size"] == 8
    client.load_model("simple", config='{"max_batch_size": 0}')  # no batching
    assert client.get_model_config("simple")["max_batch_size"] == 0
    assert client.infer("simple", simple_inputs(2)).as_numpy("OUTPUT0").shape == (2, 16)


def test_load_reads_the_repository_again(explicit, triton_repository):
    client = httpclient.InferenceServerClient(explicit.url)
    name = f"added_{uuid.uuid4().hex[:8]}"
    status, message = message_of(client.load_model, name)
    assert status == "400" and message.startswith(f"failed to load '{name}'")
    write_model(triton_repository, name, 1, simple_model())
    try:
        client.load_model(name)
        result = client.infer(name, simple_inputs(1, seed=4))
        assert result.as_numpy("OUTPUT1").shape == (1, 16)
        assert any(e["name"] == name for e in client.get_model_repository_index())
        client.unload_model(name)
    finally:
        for path in sorted((triton_repository / name).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (triton_repository / name).rmdir()


def test_a_model_name_cannot_leave_the_repository(explicit):
    for name in ("..", "%2e%2e", ".hidden"):
        response = httpx.post(f"http://{explicit.url}/v2/repository/models/{name}/load")
        assert response.status_code in (400, 404), name
    assert httpx.post(f"http://{explicit.url}/v2/repository/index").status_code == 200


def test_unload_lets_in_flight_inferences_finish(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("slow")
    # Four times the rows of the other tests: on a loaded machine the inference must
    # outlast the scrapes that look for it in flight (one stream on every core computes
    # a batch fast).
    rows = 4 * SLOW_ROWS
    x = np.random.default_rng(0).standard_normal((rows, SLOW_WIDTH)).astype(np.float32)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    outcome: dict[str, object] = {}

    def infer() -> None:
        try:
            worker = httpclient.InferenceServerClient(explicit.url, network_timeout=300)
            outcome["result"] = worker.infer("slow", [tensor]).as_numpy("y")
        except InferenceServerException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=infer)
    thread.start()
    in_flight = "aioinfer_inference_requests_in_flight"
    wait_until(lambda: scrape_metric(explicit.url, in_flight, model="slow") == 1, 60, "in flight")
    client.unload_model("slow")  # returns once the inference is done
    thread.join(60)  # closing the model under it would have answered 503 (aborted)
    assert "error" not in outcome, outcome.get("error")
    assert np.asarray(outcome["result"]).shape == (rows, SLOW_WIDTH)
    status, message = message_of(client.infer, "slow", [tensor])
    assert status == "404" and message.startswith("Request for unknown model: 'slow'")


def test_model_control_options_are_checked(triton_repository):
    with pytest.raises(ServingConfigError, match="needs model_control_mode 'explicit'"):
        create_app(triton_repository, load_models=["simple"])
    with pytest.raises(ServingConfigError, match=r"\['nope'\], not in the repository"):
        create_app(triton_repository, model_control_mode="explicit", load_models=["nope"])
    with pytest.raises(ServingConfigError, match="'poll' is not supported"):
        create_app(triton_repository, model_control_mode="poll")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--load-model", "simple"], "needs model_control_mode 'explicit'"),
        (["--model-control-mode", "explicit", "--load-model", "nope"], "not in the repository"),
    ],
)
def test_serve_command_checks_the_model_control_options(triton_repository, options, words):
    done = subprocess.run(
        [sys.executable, "-m", "aioinfer.cli", "serve", str(triton_repository), *options],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2 and words in done.stderr, done.stderr


# -- system shared memory -----------------------------------------------------------------


@pytest.fixture()
def region() -> Iterator[tuple[str, shared_memory.SharedMemory]]:
    """A 256-byte POSIX shared-memory object: its key and the object."""
    key = f"/aioinfer_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("fixture", key, 256)
    try:
        yield key, handle
    finally:
        shm.destroy_shared_memory_region(handle)


def register_status(url: str, name: str, body: dict) -> tuple[int, str]:
    response = httpx.post(f"http://{url}/v2/systemsharedmemory/region/{name}/register", json=body)
    return response.status_code, response.json().get("error", "") if response.content else ""


def test_regions_are_confined_to_posix_shared_memory(server, tmp_path, region):
    key, _ = region
    outside = tmp_path / "secret"
    outside.write_bytes(b"x" * 4096)
    link = Path("/dev/shm") / f"aioinfer_link_{uuid.uuid4().hex[:12]}"
    link.symlink_to(outside)
    try:
        for bad_key, words in (
            ("../../" + str(outside), "is not the name of a POSIX shared-memory object"),
            (str(outside), "is not the name of a POSIX shared-memory object"),
            ("/..", "is not the name"),
            ("/" + link.name, "Unable to open shared memory region 'r'"),  # no symlink
            ("/aioinfer_missing_" + uuid.uuid4().hex, "Unable to open"),
        ):
            status, message = register_status(server.url, "r", {"key": bad_key, "byte_size": 8})
            assert status == 400 and words in message, (bad_key, message)
            assert "'r'" in message
        status, message = register_status(server.url, "r", {"key": key, "byte_size": 512})
        assert status == 400 and "does not fit the 256 bytes" in message
        status, message = register_status(server.url, "r", {"key": key, "byte_size": -1})
        assert status == 400 and "byte_size must be an integer >= 0" in message
    finally:
        link.unlink()
    assert outside.read_bytes() == b"x" * 4096


def test_tensor_windows_are_checked_against_their_region(client, region):
    key, handle = region
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("data", key, 128, offset=64)
    try:
        status, message = message_of(client.register_system_shared_memory, "data", key, 8)
        assert status == "400" and "'data' already in manager" in message
        assert client.get_system_shared_memory_status("data") == [
            {"name": "data", "key": key, "offset": 64, "byte_size": 128}
        ]

        def infer_with(offset: int, size: int, region_name: str = "data", out: int = 64):
            inputs = []
            for index, name in enumerate(("INPUT0", "INPUT1")):
                tensor = httpclient.InferInput(name, [1, 16], "INT32")
                tensor.set_shared_memory(region_name, size, offset=offset + 64 * index)
                inputs.append(tensor)
            wanted = httpclient.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory("data", out, offset=0)
            return client.infer("simple", inputs, outputs=[wanted])

        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)], offset=64)
        shm.set_shared_memory_region(handle, [np.full(16, 5, np.int32)], offset=128)
        output = infer_with(0, 64).get_output("OUTPUT0")
        assert output["parameters"]["shared_memory_region"] == "data"
        assert output["shape"] == [1, 16] and "data" not in output  # it is in the region
        written = shm.get_contents_as_numpy(handle, np.int32, [16], offset=64)
        np.testing.assert_array_equal(written, np.arange(16) + 5)

        for args, words in (
            ((64, 64), "invalid offset + byte size for shared memory region 'data'"),
            ((0, 60), "unexpected total byte size 60"),
            ((0, 64, "nope"), "Unable to find system shared memory region: 'nope'"),
            ((0, 64, "data", 32), "should be at least 64 bytes"),
        ):
            status, message = message_of(infer_with, *args)
            assert status == "400" and words in message, message
        status, message = message_of(client.get_system_shared_memory_status, "nope")
        assert status == "400" and "'nope'" in message
    finally:
        client.unregister_system_shared_memory()


def test_cuda_shared_memory_is_answered_not_supported(server, client):
    client.unregister_cuda_shared_memory()  # nothing registered: no error (as Triton)
    assert client.get_cuda_shared_memory_status() == []
    response = httpx.post(
        f"http://{server.url}/v2/cudasharedmemory/region/gpu/register",
        json={"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8},
    )
    assert response.status_code == 400
    assert "CUDA shared memory is not supported" in response.json()["error"]


def test_inputs_are_read_in_place_and_read_only(region):
    key, handle = region
    registry = SystemSharedMemory()
    registry.register("in", key, 0, 64)
    data = np.arange(16, dtype=np.int32)
    shm.set_shared_memory_region(handle, [data])
    shared = SharedInput(SharedMemoryRef("in", 64), "INT32", (1, 16))
    array = registry.read("INPUT0", shared)
    np.testing.assert_array_equal(array[0], data)
    assert not array.flags.writeable
    shm.set_shared_memory_region(handle, [data * 10])  # the client writes again...
    np.testing.assert_array_equal(array[0], data * 10)  # ...and the same array sees it
    registry.unregister("in")  # while a view is alive: no error, the view stays valid
    np.testing.assert_array_equal(array[0], data * 10)
    with pytest.raises(SharedMemoryError, match="Unable to find system shared memory region"):
        registry.read("INPUT0", shared)


def test_a_region_its_owner_shrank_is_refused_not_read():
    owner = shared_memory.SharedMemory(create=True, size=4096)
    try:
        registry = SystemSharedMemory()
        registry.register("in", "/" + owner.name, 0, 4096)
        os.truncate(Path("/dev/shm") / owner.name, 16)  # behind the server's back
        shared = SharedInput(SharedMemoryRef("in", 64, 1024), "INT32", (1, 16))
        with pytest.raises(SharedMemoryError, match="which now has 16 bytes"):
            registry.read("INPUT0", shared)
        registry.unregister()
    finally:
        owner.close()
        owner.unlink()


# -- the same on the service, without HTTP (what every transport calls) -------------------


@pytest.fixture()
async def service(triton_repository: Path, anyio_backend: str) -> AsyncIterator[InferenceService]:
    served = InferenceService(
        ModelRepository(triton_repository), model_control_mode="explicit", load_models=["*"]
    )
    async with served.lifespan():
        yield served


@pytest.mark.anyio
async def test_service_infers_from_and_into_shared_memory(service, region):
    key, handle = region
    service.register_system_shared_memory("io", key, 0, 256)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    shm.set_shared_memory_region(handle, [np.full(16, 2, np.int32)], offset=64)
    request = InferenceRequest(
        id="shm",
        parameters={},
        inputs={},
        outputs=[RequestedOutput("OUTPUT1", True, SharedMemoryRef("io", 64, 128))],
        shared_inputs={
            "INPUT0": SharedInput(SharedMemoryRef("io", 64, 0), "INT32", (1, 16)),
            "INPUT1": SharedInput(SharedMemoryRef("io", 64, 64), "INT32", (1, 16)),
        },
    )
    response = await service.infer("simple", None, request)
    assert list(response.shared_outputs) == ["OUTPUT1"]
    written = shm.get_contents_as_numpy(handle, np.int32, [16], offset=128)
    np.testing.assert_array_equal(written, np.arange(16) - 2)
    stats = service.statistics("simple")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 1
    assert service.system_shared_memory_status() == [
        {"name": "io", "key": key, "offset": 0, "byte_size": 256}
    ]


@pytest.mark.anyio
async def test_service_unload_refuses_new_requests_at_once(service):
    await service.unload_model("simple_int8")
    with pytest.raises(ServiceError) as caught:
        service.find("simple_int8", None)
    assert caught.value.kind is ErrorKind.NOT_FOUND
    await service.load_model("simple_int8", '{"max_batch_size": 4}')
    assert service.model_config(service.find("simple_int8", None))["max_batch_size"] == 4
