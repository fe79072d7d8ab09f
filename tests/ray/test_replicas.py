"""Two replicas of a model: both serve under load, and a sequence stays on one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers import mlp_model, reference_outputs
from tests.ray.conftest import RayApp

RTOL, ATOL = 1e-5, 1e-6


def mlp_infer(url: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("mlp", [tensor], model_version="1").as_numpy("y")


def test_two_replicas_both_serve_under_load_and_every_result_is_right(ray_app: RayApp):
    before = ray_app.replica_statuses("mlp", 2)
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 4, 160)
    inputs = [rng.standard_normal((int(rows), 4)).astype(np.float32) for rows in sizes]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda x: mlp_infer(ray_app.url, x), inputs))
    model = mlp_model(seed=0)
    for x, y in zip(inputs, results, strict=True):
        np.testing.assert_allclose(y, reference_outputs(model, {"x": x})[0], rtol=RTOL, atol=ATOL)
    after = ray_app.replica_statuses("mlp", 2)
    assert after.keys() == before.keys()
    # status() counts as no request; each replica took a share of the 160.
    served = {pid: after[pid]["requests"] - before[pid]["requests"] for pid in after}
    assert sum(served.values()) == len(inputs)
    assert min(served.values()) >= len(inputs) // 8, served


def accumulate(
    client: httpclient.InferenceServerClient, sequence: int, x: np.ndarray, start: bool, end: bool
) -> np.ndarray:
    tensor = httpclient.InferInput("x", list(x.shape), "INT64")
    tensor.set_data_from_numpy(x)
    result = client.infer(
        "accumulator", [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end
    )
    return result.as_numpy("y")


def test_a_sequence_reaches_the_replica_holding_its_state(ray_app: RayApp):
    client = httpclient.InferenceServerClient(ray_app.url, concurrency=4)
    rng = np.random.default_rng(5)
    sequences = range(101, 117)
    totals = {s: np.zeros((1, 4), np.int64) for s in sequences}
    steps = 5
    for step in range(steps):
        for sequence in sequences:  # interleaved: every replica sees every step
            x = rng.integers(-50, 50, (1, 4)).astype(np.int64)
            totals[sequence] = totals[sequence] + x
            y = accumulate(client, sequence, x, step == 0, False)
            np.testing.assert_array_equal(y, totals[sequence])  # exact: integers
        if step == steps - 2:
            held = ray_app.replica_statuses("accumulator", 2)
    # Both replicas hold some of the 16 open sequences, and together all of them.
    open_sequences = sorted(status["sequences"] for status in held.values())
    assert open_sequences[0] > 0 and sum(open_sequences) == len(sequences)
    for sequence in sequences:
        x = np.ones((1, 4), np.int64)
        accumulate(client, sequence, x, False, True)
    assert sum(s["sequences"] for s in ray_app.replica_statuses("accumulator", 2).values()) == 0
    with pytest.raises(InferenceServerException) as ended:
        accumulate(client, 101, np.ones((1, 4), np.int64), False, False)
    assert ended.value.status() == "400"
    assert "sequence 101 of model 'accumulator' is not active" in ended.value.message()
