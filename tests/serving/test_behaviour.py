"""The server under load and faults: disconnects, a full queue, limits, shutdown, metrics,
sequences and batching, against a live server on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from aioinfer.errors import RequestClosedError
from aioinfer.serving import create_app
from tests.helpers import mlp_model, reference_outputs, wait_until
from tests.helpers import scrape_metric as metric
from tests.serving.conftest import WIDE, LiveServer, chain_model

SLOW_ROWS = 1024


def binary_body(inputs: dict[str, np.ndarray], **extra: Any) -> tuple[bytes, dict[str, str]]:
    """An infer request with every input as binary data, and its headers."""
    specs = [
        {
            "name": name,
            "shape": list(array.shape),
            "datatype": "FP32",
            "parameters": {"binary_data_size": array.nbytes},
        }
        for name, array in inputs.items()
    ]
    header = json.dumps({"inputs": specs, **extra}).encode()
    body = header + b"".join(array.tobytes() for array in inputs.values())
    return body, {"Inference-Header-Content-Length": str(len(header))}


def json_body(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    spec = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    return {"inputs": [spec], **extra}


def slow_input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((SLOW_ROWS, WIDE)).astype(np.float32)


def timed_slow_infer(url: str) -> float:
    body, headers = binary_body({"x": slow_input()})
    start = time.perf_counter()
    response = httpx.post(
        f"http://{url}/v2/models/slow/infer", content=body, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text
    return time.perf_counter() - start


# -- disconnects, the queue, limits -------------------------------------------------------


def test_a_client_that_disconnects_cancels_its_running_inference(server: LiveServer):
    full = timed_slow_infer(server.url)
    cancelled_before = metric(server.url, "aioinfer_inference_failures_total", reason="cancelled")
    # Four times the rows of the timed request: on a loaded machine, seeing it in flight
    # and waiting a tenth of `full` cannot outlast its compute.
    body, headers = binary_body({"x": np.concatenate([slow_input()] * 4)})
    head = (
        f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: {server.url}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n\r\n"
    )
    in_flight = "aioinfer_inference_requests_in_flight"
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        connection.sendall(head.encode() + body)
        wait_until(lambda: metric(server.url, in_flight, model="slow") == 1, 60, "in flight")
        time.sleep(full / 10)
    # The inference stops between kernels: far sooner than it would have finished.
    stopped = wait_until(lambda: metric(server.url, in_flight, model="slow") == 0, full, "stop")
    assert stopped < full / 2, (stopped, full)
    after = metric(server.url, "aioinfer_inference_failures_total", reason="cancelled")
    assert after == cancelled_before + 1
    assert timed_slow_infer(server.url) > 0  # and the model serves the next request


def test_a_full_queue_answers_503(server: LiveServer):
    busy_before = metric(server.url, "aioinfer_inference_failures_total", reason="busy")
    statuses: list[int] = []

    # Four times the usual rows (a fraction of a second to seconds of compute): the
    # running request does not finish between the second one's admission to the queue and
    # the third request.
    long_input = np.concatenate([slow_input()] * 4)
    served = server.app.state.server.find("slow", None)

    def post() -> None:
        body, headers = binary_body({"x": long_input})
        url = f"http://{server.url}/v2/models/slow/infer"
        statuses.append(httpx.post(url, content=body, headers=headers, timeout=60).status_code)

    threads = [threading.Thread(target=post) for _ in range(2)]  # one runs, one waits
    for thread in threads:
        thread.start()
    in_flight = "aioinfer_inference_requests_in_flight"
    wait_until(lambda: metric(server.url, in_flight, model="slow") == 2, 30, "two in flight")
    # In flight counts a request from its arrival; it joins the queue once decoded.
    wait_until(lambda: served.waiting == 1, 30, "the second request to wait")
    body, headers = binary_body({"x": slow_input()[:1]})
    response = httpx.post(
        f"http://{server.url}/v2/models/slow/infer", content=body, headers=headers
    )
    assert response.status_code == 503
    assert "at capacity" in response.json()["error"] and "1 waiting" in response.json()["error"]
    for thread in threads:
        thread.join(60)
    assert statuses == [200, 200]
    after = metric(server.url, "aioinfer_inference_failures_total", reason="busy")
    assert after == busy_before + 1


def test_request_size_limit_and_malformed_bodies(tmp_path: Path):
    onnx.save(mlp_model(), tmp_path / "single.onnx")
    app = create_app(tmp_path / "single.onnx", max_request_bytes=2000)
    with LiveServer(app) as live:
        url = f"http://{live.url}/v2/models/single/infer"
        too_big = json_body(np.zeros((200, 4), np.float32))
        response = httpx.post(url, json=too_big)
        assert response.status_code == 413 and "limit is 2000" in response.json()["error"]
        response = httpx.post(url, content=b"{not json")
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
        bad_count = json_body(np.zeros((2, 4), np.float32))
        bad_count["inputs"][0]["data"] = [1.0, 2.0]
        response = httpx.post(url, json=bad_count)
        assert response.status_code == 400
        assert response.json()["error"] == "input 'x': 2 values in 'data', the shape needs 8"
        response = httpx.get(f"http://{live.url}/v2/nothing/here")
        assert response.status_code == 404 and "error" in response.json()
        # A single .onnx file is served as model "single", version 1.
        ok = httpx.post(url, json=json_body(np.ones((1, 4), np.float32)))
        assert ok.status_code == 200 and ok.json()["model_version"] == "1"


# -- shutdown -----------------------------------------------------------------------------


def test_shutdown_drains_in_flight_requests_and_refuses_new_ones(tmp_path: Path):
    onnx.save(chain_model(300), tmp_path / "slow.onnx")
    app = create_app(tmp_path / "slow.onnx")
    live = LiveServer(app, graceful_timeout=120)
    with live:
        served = app.state.server.find("slow", None)
        full = timed_slow_infer(live.url)
        outcome: list[httpx.Response] = []
        body, headers = binary_body({"x": slow_input()})
        url = f"http://{live.url}/v2/models/slow/infer"
        worker = threading.Thread(
            target=lambda: outcome.append(
                httpx.post(url, content=body, headers=headers, timeout=60)
            )
        )
        worker.start()
        in_flight = "aioinfer_inference_requests_in_flight"
        wait_until(lambda: metric(live.url, in_flight) == 1, 60, "in flight")
        live.stop()

        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", live.port), timeout=1).close()
            except OSError:
                return True
            return False

        wait_until(refused, full, "the port to close")
        assert worker.is_alive(), "the in-flight request should still be running"
        worker.join(60)
        assert outcome[0].status_code == 200
        assert np.asarray(outcome[0].json()["outputs"][0]["shape"]).tolist() == [SLOW_ROWS, WIDE]
    # After the drain the lifespan closed the models.
    with pytest.raises(RequestClosedError):
        served.compiled.create_infer_request()


def test_a_closing_server_refuses_inferences_and_is_not_ready(server: LiveServer):
    state = server.app.state.server  # type: ignore[attr-defined]
    state.closing = True
    try:
        response = httpx.post(
            f"http://{server.url}/v2/models/mlp/infer", json=json_body(np.ones((1, 4), np.float32))
        )
        assert response.status_code == 503 and "shutting down" in response.json()["error"]
        assert httpx.get(f"http://{server.url}/v2/health/ready").status_code == 400
        assert httpx.get(f"http://{server.url}/v2/models/mlp/ready").status_code == 400
    finally:
        state.closing = False
    assert httpx.get(f"http://{server.url}/v2/health/ready").status_code == 200


# -- metrics ------------------------------------------------------------------------------


def test_metrics_count_requests_failures_latency_queue_time_and_batches(server: LiveServer):
    def value(name: str, **labels: str) -> float:
        return metric(server.url, name, model="mlp", version="1", **labels)

    names = (
        "aioinfer_inference_requests_total",
        "aioinfer_request_duration_seconds_count",
        "aioinfer_queue_duration_seconds_count",
        "aioinfer_batch_size_count",
        "aioinfer_batch_size_sum",
    )
    before = {name: value(name) for name in names}
    failed_before = value("aioinfer_inference_failures_total", reason="bad_request")
    url = f"http://{server.url}/v2/models/mlp/versions/1/infer"
    for count in (1, 2, 3):
        assert httpx.post(url, json=json_body(np.ones((count, 4), np.float32))).status_code == 200
    assert httpx.post(url, json=json_body(np.ones((1, 7), np.float32))).status_code == 400
    after = {name: value(name) for name in names}
    assert after["aioinfer_inference_requests_total"] - before[names[0]] == 4
    assert value("aioinfer_inference_failures_total", reason="bad_request") == failed_before + 1
    assert after[names[1]] - before[names[1]] == 3  # latency of the successful ones
    assert after[names[2]] - before[names[2]] == 3
    assert after[names[3]] - before[names[3]] == 3  # one batch each (sequential requests)
    assert after[names[4]] - before[names[4]] == 6  # 1 + 2 + 3 rows
    text = httpx.get(f"http://{server.url}/metrics").text
    assert 'aioinfer_batch_size_bucket{le="2",model="mlp",version="1"}' in text


# -- batching through the server ----------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_requests_are_batched_and_a_bad_one_fails_alone(server: LiveServer):
    served = server.app.state.server.find("mlp", "1")  # type: ignore[attr-defined]
    before = sum(served.batch_sizes().values())
    rng = np.random.default_rng(8)
    feeds = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(12)]
    statuses: dict[int, httpx.Response] = {}
    url = f"http://{server.url}/v2/models/mlp/versions/1/infer"
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(index: int) -> None:
            x = np.ones((1, 5), np.float32) if index == 4 else feeds[index]
            statuses[index] = await client.post(url, json=json_body(x, id=str(index)))

        async with anyio.create_task_group() as group:
            for index in range(12):
                group.start_soon(one, index)
    assert statuses[4].status_code == 400 and "'x'" in statuses[4].json()["error"]
    for index, response in statuses.items():
        if index == 4:
            continue
        assert response.status_code == 200 and response.json()["id"] == str(index)
        y = np.asarray(response.json()["outputs"][0]["data"], np.float32).reshape(1, 3)
        expected = reference_outputs(mlp_model(seed=0), {"x": feeds[index]})[0]
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    assert sum(served.batch_sizes().values()) - before < 11


# -- sequences ----------------------------------------------------------------------------


def accumulate(
    client: httpclient.InferenceServerClient, x: list[float], sequence: int, **flags: bool
) -> np.ndarray:
    tensor = httpclient.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([x], np.float32))
    result = client.infer("accumulator", [tensor], sequence_id=sequence, **flags)
    return result.as_numpy("total")[0].tolist()  # type: ignore[no-any-return]


def test_a_sequence_keeps_its_state_in_its_own_request(server: LiveServer):
    client = httpclient.InferenceServerClient(server.url)
    assert accumulate(client, [1, 2], 11, sequence_start=True) == [1, 2]
    assert accumulate(client, [1, 2], 11) == [2, 4]
    assert accumulate(client, [10, 10], 12, sequence_start=True) == [10, 10]
    assert accumulate(client, [1, 1], 11, sequence_end=True) == [3, 5]
    with pytest.raises(InferenceServerException, match=r"sequence 11 .* is not active") as caught:
        accumulate(client, [1, 1], 11)
    assert caught.value.status() == "400"
    assert accumulate(client, [10, 10], 12) == [20, 20]
    assert accumulate(client, [5, 5], 12, sequence_start=True) == [5, 5]  # a restart


def test_requests_outside_a_sequence_start_from_the_initial_state(server: LiveServer):
    """A stateful model's request that names no sequence shares no state with others."""
    client = httpclient.InferenceServerClient(server.url)
    for _ in range(3):
        assert accumulate(client, [1, 2], 0) == [1, 2]  # sequence_id 0: none


def test_an_idle_sequence_times_out(server: LiveServer):
    client = httpclient.InferenceServerClient(server.url)
    assert accumulate(client, [1, 1], 13, sequence_start=True) == [1, 1]
    served = server.app.state.server.find("accumulator", None)  # type: ignore[attr-defined]
    wait_until(lambda: 13 not in served.sequences, 60, "the idle timeout (1 s)")
    with pytest.raises(InferenceServerException, match="not active"):
        accumulate(client, [1, 1], 13)


def test_sequence_requests_of_a_stateless_model_stay_on_one_request(server: LiveServer):
    served = server.app.state.server.find("mlp", "2")  # type: ignore[attr-defined]
    url = f"http://{server.url}/v2/models/mlp/infer"
    x = np.ones((1, 4), np.float32)

    def post(**parameters: Any) -> None:
        body = json_body(x, parameters={"sequence_id": "s-21", **parameters})
        assert httpx.post(url, json=body).status_code == 200

    post(sequence_start=True)
    first = served.sequences["s-21"]
    post()
    post()
    assert served.sequences["s-21"] is first
    post(sequence_start=True)  # a new sequence under the same id gets a new request
    assert served.sequences["s-21"] is not first
    post(sequence_end=True)
    assert "s-21" not in served.sequences
