"""The model manager behind a live server, with the unmodified tritonclient: memory
accounted per model against the process's resident memory, memory given back at
unload (a PROCESS worker ends), clients waiting for loads, the repository index and
``/metrics``; ``aioinfer serve --memory-budget`` and the config file's keys."""

from __future__ import annotations

import concurrent.futures
import gc
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from aioinfer.errors import ModelMemoryError, RepositoryError
from aioinfer.serving import ModelConfig, create_app
from tests.helpers import matmul_model, mlp_model, process_alive, scrape_metric, wait_until
from tests.serving.conftest import LiveServer, write_config, write_model

MB = 2**20
ROOT = Path(__file__).resolve().parents[2]
CPU = {"device": "CPU", "batching": False}


def infer(client: httpclient.InferenceServerClient, name: str, width: int) -> np.ndarray:
    x = np.ones((1, width), np.float32)
    tensor = httpclient.InferInput("x", [1, width], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(name, [tensor])
    return result.as_numpy(result.get_response()["outputs"][0]["name"])


def resident() -> int:
    return int(psutil.Process().memory_info().rss)


def test_a_models_memory_is_what_its_load_adds_and_unloading_gives_it_back(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "warm", 1, matmul_model(1024, seed=0))
    write_model(tmp_path, "big", 1, matmul_model(3072, seed=1))  # 36 MiB of weights
    for name in ("warm", "big"):
        write_config(tmp_path, name, CPU)
    weights = 4 * 3072**2
    app = create_app(tmp_path, model_control_mode="explicit", memory_budget="1GiB")
    with LiveServer(app) as server:
        client = httpclient.InferenceServerClient(server.url)
        infer(client, "warm", 1024)  # the CPU device's own first-use costs, paid
        client.unload_model("warm")
        before = resident()
        infer(client, "big", 3072)
        loaded = resident()
        accounted = scrape_metric(server.url, "aioinfer_model_memory_bytes", model="big")
        client.unload_model("big")
        wait_until(lambda: not client.is_model_ready("big"), 30, "the unload")
        after = resident()
        freed = scrape_metric(server.url, "aioinfer_model_memory_bytes", model="big")
    added = loaded - before
    # The accounting is what the load added to the resident memory, at least the weights.
    assert weights <= accounted <= 1.5 * added + 8 * MB, (accounted, added)
    assert added >= 0.9 * weights, added
    # Unloaded: the memory goes back to the system, within a quarter of what it added.
    assert after - before <= 0.25 * added, (before, loaded, after)
    assert freed == 0


def test_unloading_a_process_model_ends_its_worker(tmp_path: Path) -> None:
    for seed, name in enumerate(("worker", "other")):
        write_model(tmp_path, name, 1, mlp_model(seed=seed))
    write_config(tmp_path, "worker", {"device": "PROCESS:CPU", "memory_bytes": 400 * MB})
    write_config(tmp_path, "other", {**CPU, "memory_bytes": 400 * MB})
    app = create_app(tmp_path, model_control_mode="explicit", memory_budget=600 * MB)
    me = psutil.Process()
    with LiveServer(app) as server:
        client = httpclient.InferenceServerClient(server.url)
        children = {child.pid for child in me.children(recursive=True)}
        infer(client, "worker", 4)
        workers = {child.pid for child in me.children(recursive=True)} - children
        assert len(workers) == 1
        infer(client, "other", 4)  # evicts the worker's model
        (pid,) = workers
        wait_until(lambda: not process_alive(pid), 30, "the worker to end")
        assert not client.is_model_ready("worker")
        assert scrape_metric(server.url, "aioinfer_model_evictions_total", model="worker") == 1


def test_clients_wait_for_loads_and_see_states_and_figures(tmp_path: Path) -> None:
    names = ("a", "b", "c")
    for seed, name in enumerate(names):
        write_model(tmp_path, name, 1, mlp_model(seed=seed))
        write_config(tmp_path, name, {**CPU, "memory_bytes": 100 * MB})
    app = create_app(tmp_path, memory_budget=250 * MB)
    with LiveServer(app) as server:
        client = httpclient.InferenceServerClient(server.url, concurrency=8)
        index = {e["name"]: e for e in client.get_model_repository_index()}
        assert [index[n]["state"] for n in names] == ["READY", "READY", "UNAVAILABLE"]
        assert index["c"]["reason"] == "unloaded"
        choices = [names[i % 3] for i in range(48)]

        def run(name: str) -> Any:
            return infer(httpclient.InferenceServerClient(server.url), name, 4)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(run, choices))
        assert all(answer.shape == (1, 3) for answer in answers)
        index = {e["name"]: e for e in client.get_model_repository_index()}
        states = sorted(e["state"] for e in index.values())
        assert states == ["READY", "READY", "UNAVAILABLE"]
        unloaded = next(e for e in index.values() if e["state"] == "UNAVAILABLE")
        assert unloaded["reason"].startswith("evicted: least recently used")
        figures = {
            metric: sum(
                scrape_metric(server.url, f"aioinfer_model_{metric}", model=n) for n in names
            )
            for metric in ("loads_total", "evictions_total", "hits_total", "misses_total")
        }
        timed = sum(
            scrape_metric(server.url, "aioinfer_model_load_duration_seconds_count", model=n)
            for n in names
        )
        budget = scrape_metric(server.url, "aioinfer_memory_budget_bytes")
    assert figures["loads_total"] == figures["evictions_total"] + 2 == timed
    assert figures["hits_total"] + figures["misses_total"] == 48
    assert figures["misses_total"] >= 1
    assert budget == 250 * MB


def test_serve_takes_a_memory_budget(tmp_path: Path) -> None:
    for seed, name in enumerate(("a", "b")):
        write_model(tmp_path, name, 1, matmul_model(512, seed=seed))  # 1 MiB each
        write_config(tmp_path, name, CPU)
    command = [sys.executable, "-m", "aioinfer.cli", "serve", str(tmp_path), "--port", "0"]
    refused = subprocess.run(
        [*command, "--memory-budget", "6XB"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "--memory-budget: unknown unit 'XB' in '6XB'" in refused.stderr
    process = subprocess.Popen(
        [*command, "--memory-budget", "1.5MiB"], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "Application startup complete" in line:
                break
        assert any("loaded model 'a'" in line for line in seen), seen
        skipped = "model 'b' not loaded at the start: it needs about 1.0 MiB"
        assert any(skipped in line for line in seen), seen
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"memory_bytes": "2GiB", "memory_budget": 1000}, (2 * 2**30, 1000)),
        ({"memory_bytes": "1.5 MB"}, (1_500_000, None)),
    ],
)
def test_the_memory_keys_of_a_config_file(values: dict[str, Any], expected: Any) -> None:
    config = ModelConfig.from_mapping(values, "config.json")
    assert (config.memory_bytes, config.memory_budget) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"pinned": 1}, "config.json: 'pinned' must be bool, got 1"),
        ({"idle_unload_s": 0}, "config.json: 'idle_unload_s' must be above 0, got 0"),
        ({"memory_bytes": "2 parsecs"}, "config.json: memory_bytes: unknown unit 'parsecs'"),
        ({"memory_budget": 0}, "config.json: memory_budget must be at least 1 byte, got 0"),
    ],
)
def test_bad_memory_keys_are_refused_with_the_file_and_the_value(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(RepositoryError) as refused:
        ModelConfig.from_mapping(values, "config.json")
    assert str(refused.value).startswith(message), str(refused.value)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # Ray Serve runs replicas on asyncio
async def test_a_ray_replica_has_a_budget_of_its_own(tmp_path: Path) -> None:
    from aioinfer.ray import ModelReplica

    write_model(tmp_path, "big", 1, matmul_model(512))  # 1 MiB of weights
    write_config(tmp_path, "big", CPU)
    # As Ray Serve makes a replica: its constructor is a coroutine.
    refused = ModelReplica.__new__(ModelReplica)
    try:
        with pytest.raises(BaseException) as raised:
            await refused.__init__(str(tmp_path), "big", memory_budget="512KiB")  # type: ignore[misc]
        error = raised.value
        while getattr(error, "exceptions", None):  # the lifespan's task groups wrap it
            error = error.exceptions[0]  # type: ignore[attr-defined]
        assert isinstance(error, ModelMemoryError)
        assert "the budget is 512.0 KiB (524288 bytes)" in str(error)
        replica = ModelReplica.__new__(ModelReplica)
        await replica.__init__(str(tmp_path), "big", memory_budget="4MiB")  # type: ignore[misc]
        assert list(replica.describe().versions) == ["1"]
        await replica.__del__()
    finally:
        gc.unfreeze()  # the replica froze the test process's objects
