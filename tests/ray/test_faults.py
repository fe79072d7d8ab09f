"""Faults on the Ray deployment: a client that goes away, a replica process killed."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import httpx
import numpy as np

from tests.helpers import process_alive, wait_until
from tests.ray.conftest import SLOW_WIDTH, RayApp


def slow_body(rows: int) -> tuple[bytes, dict[str, str]]:
    """A binary infer request for the slow model, and its headers."""
    x = np.ones((rows, SLOW_WIDTH), np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return header + x.tobytes(), headers


def slow_statuses(ray_app: RayApp) -> tuple[int, int]:
    """Infer requests so far and in flight on the slow model's two replicas."""
    statuses = ray_app.replica_statuses("slow", 2).values()
    return sum(s["requests"] for s in statuses), sum(s["in_flight"] for s in statuses)


def test_a_client_that_goes_away_cancels_the_inference_on_the_replica(ray_app: RayApp):
    url = f"http://{ray_app.url}/v2/models/slow/infer"
    body, headers = slow_body(1024)
    start = time.perf_counter()
    assert httpx.post(url, content=body, headers=headers, timeout=120).status_code == 200
    full = time.perf_counter() - start  # the control: a whole inference, end to end
    requests, _ = slow_statuses(ray_app)
    try:
        httpx.post(url, content=body, headers=headers, timeout=full / 4)
    except httpx.TimeoutException:
        pass  # the client gave up and closed its connection
    else:
        raise AssertionError("the inference ended before the client went away")
    gone = time.perf_counter()

    def dropped() -> bool:
        now, in_flight = slow_statuses(ray_app)
        return now > requests and in_flight == 0

    # Not cancelled, it would run for about 3/4 of ``full`` more.
    wait_until(dropped, timeout=120, what="the replica to drop the inference")
    assert time.perf_counter() - gone < full / 2


def run_load(url: str, stop: threading.Event, outcomes: Counter[str], errors: list[str]) -> None:
    body, headers = slow_body(256)
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            response = client.post(
                f"http://{url}/v2/models/slow/infer", content=body, headers=headers
            )
            outcomes[str(response.status_code)] += 1
            if response.status_code != 200:
                errors.append(response.json()["error"])


def test_a_killed_replica_fails_its_requests_with_503_and_is_replaced(ray_app: RayApp):
    statuses = ray_app.replica_statuses("slow", 2)
    victim = min(statuses)
    stop = threading.Event()
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    workers = [
        threading.Thread(target=run_load, args=(ray_app.url, stop, outcomes, errors))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        wait_until(
            lambda: all(s["in_flight"] for s in ray_app.replica_statuses("slow", 2).values()),
            timeout=60,
            what="both replicas to compute",
        )
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not process_alive(victim), timeout=30, what="the replica to die")
        answered = outcomes["200"]
        # The other replica keeps serving meanwhile.
        wait_until(lambda: outcomes["200"] >= answered + 8, timeout=120, what="more answers")
    finally:
        stop.set()
        for worker in workers:
            worker.join(120)
    assert set(outcomes) == {"200", "503"}, (outcomes, errors[:3])
    assert all("its replica went away" in error and "retry" in error for error in errors), errors

    def replaced() -> bool:
        try:
            replicas = set(ray_app.replica_statuses("slow", 2, timeout=5))
        except Exception:  # the handle may still try the dead replica
            return False
        return victim not in replicas

    wait_until(replaced, timeout=120, what="Ray to replace the replica")
    body, headers = slow_body(4)
    with httpx.Client(timeout=120) as client:
        for _ in range(10):
            url = f"http://{ray_app.url}/v2/models/slow/infer"
            assert client.post(url, content=body, headers=headers).status_code == 200
