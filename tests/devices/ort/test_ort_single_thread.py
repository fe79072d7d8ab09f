"""ORT runs short inferences on a one-thread session where that measures faster
(``ORT_SINGLE_THREAD_RUN_US``, aioinfer.devices.ort.single)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import onnxruntime as ort
import pytest

import aioinfer as ai
from aioinfer.devices.ort.single import RETRY_EVERY, SingleThreadRuns
from aioinfer.models import default_model_path
from tests.helpers import chain_model, reference_outputs

WIDTH = 16
LATENCY_TWO_THREADS = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}


def _rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, WIDTH)).astype(np.float32)


async def _until_made(runs: SingleThreadRuns) -> None:
    with anyio.fail_after(60):
        while runs.session is None and runs.failed is None:
            await anyio.sleep(0.01)
    assert runs.failed is None


def _one_thread_session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(default_model_path()), options)


@pytest.mark.anyio
async def test_short_runs_move_to_the_one_thread_session_where_it_is_faster() -> None:
    """Given the times of runs on both sessions, the faster one takes the runs of those
    input shapes, the other one run in RETRY_EVERY; a run longer than the limit, or of
    shapes not measured yet, stays on the compiled model's session, and the one-thread
    session is made (on a thread of its own) only once a run is short."""
    runs = SingleThreadRuns(500e-6, _one_thread_session)
    small, large = ((1, 8),), ((64, 8),)
    assert not runs.use_single(small)  # never measured
    runs.record(large, 2e-3, single=False)
    assert not runs.use_single(large) and runs.session is None  # long: nothing made
    runs.record(small, 40e-6, single=False)
    assert not runs.use_single(small)  # short: the session is being made meanwhile
    await _until_made(runs)
    assert runs.use_single(small)  # not measured on it yet: measure it
    runs.record(small, 20e-6, single=True)
    choices = [runs.use_single(small) for _ in range(2 * RETRY_EVERY)]
    assert choices.count(False) == 2  # the other session, once in RETRY_EVERY
    for _ in range(30):  # the one-thread session turns slower: the runs move back
        runs.record(small, 90e-6, single=True)
    choices = [runs.use_single(small) for _ in range(2 * RETRY_EVERY)]
    assert choices.count(True) == 2


def test_runs_stretched_by_load_do_not_swing_the_choice() -> None:
    """On a loaded machine a run now and then loses a time slice (a millisecond instead
    of 40 us), more often on the session that needs both cores: such runs barely move
    its average, so the faster session keeps the runs; a lasting change still moves
    them within a few dozen runs."""
    runs = SingleThreadRuns(500e-6, _one_thread_session)
    runs.session = object()  # type: ignore[assignment]  # the choice alone is tested
    shapes = ((1, 8),)
    runs.record(shapes, 40e-6, single=False)
    runs.record(shapes, 60e-6, single=True)
    chosen = []
    for run in range(400):
        on_single = runs.use_single(shapes)
        chosen.append(on_single)
        stretched = run % 7 == 0  # one run in seven loses a time slice
        seconds = 1e-3 if stretched else (60e-6 if on_single else 40e-6)
        runs.record(shapes, seconds, single=on_single)
    assert chosen.count(True) <= 400 // RETRY_EVERY + 1  # the probes of the other only
    for _ in range(40):  # the two-thread session turns slower for good
        runs.record(shapes, 120e-6, single=False)
    assert runs.use_single(shapes)


@pytest.mark.anyio
async def test_both_sessions_give_the_reference_results_and_cancel() -> None:
    """A short model's runs, on whichever session, agree with onnx.reference; a cancel
    still stops a run and leaves the request usable."""
    model = chain_model(4, WIDTH)
    compiled = ai.Core().compile_model(model, "ORT", LATENCY_TWO_THREADS)
    runs = compiled.single_thread
    assert runs is not None
    request = compiled.create_infer_request()
    x = _rows(2)
    expected = reference_outputs(model, {"x": x})[0]
    for _ in range(20):  # until the average run time forgets the first, slow run
        await request.infer({"x": x})
    await _until_made(runs)
    for _ in range(3 * RETRY_EVERY):
        result = await request.infer({"x": x})
        np.testing.assert_allclose(result["y"], expected, rtol=1e-5, atol=1e-6)
    shapes = ((2, WIDTH),)
    assert shapes in runs.single.seconds and shapes in runs.wide.seconds  # both sessions ran
    request.start_async({"x": x})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    np.testing.assert_allclose((await request.infer({"x": x}))["y"], expected, rtol=1e-5, atol=1e-6)
    await compiled.close()


@pytest.mark.parametrize(
    "config",
    [
        {"PERFORMANCE_HINT": "THROUGHPUT"},  # one thread per stream already
        {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1},
        {**LATENCY_TWO_THREADS, "ORT_SINGLE_THREAD_RUN_US": 0},  # turned off
        {**LATENCY_TWO_THREADS, "PERF_COUNT": True},  # profiling runs one session
    ],
)
def test_no_second_session_where_it_cannot_pay(config: dict[str, object]) -> None:
    compiled = ai.Core().compile_model(chain_model(2, WIDTH), "ORT", config)
    assert compiled.single_thread is None
    assert compiled.get_property("ORT_SINGLE_THREAD_RUN_US") == config.get(
        "ORT_SINGLE_THREAD_RUN_US", 500
    )


EXIT_WHILE_MAKING = """
import numpy as np
import aioinfer as ai
from tests.helpers import chain_model

compiled = ai.Core().compile_model(
    chain_model(4, 16), "ORT", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
)
request = compiled.create_infer_request()
x = np.ones((2, 16), np.float32)
while compiled.single_thread._thread is None:  # until a short run starts the session
    request.infer_sync({"x": x})
print("exiting")
"""


def test_exiting_while_the_session_is_made_does_not_abort() -> None:
    """The interpreter ending while the one-thread session is being made (no close)
    waits for it: onnxruntime aborted the process otherwise."""
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_MAKING],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[3],
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "exiting"
