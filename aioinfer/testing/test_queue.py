"""AsyncInferQueue on each device: every job once, errors re-raised once (by
``start_async``, ``wait_all`` or ``get_idle_request_id``) and kept on the job's request,
idle request ids, the optimal number of requests, closing cancels."""

from __future__ import annotations

import time

import anyio
import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.models import inputs, reference, reshape_model

pytestmark = pytest.mark.anyio


async def test_queue_delivers_each_job_once_with_its_userdata(small):
    model, compiled = small
    queue = ai.AsyncInferQueue(compiled, jobs=2)
    assert len(queue) == 2
    got: dict[int, np.ndarray] = {}

    def callback(request, userdata):
        assert userdata not in got
        got[userdata] = request.results["y"]

    queue.set_callback(callback)
    xs = [inputs(10 + i, rows=2) for i in range(9)]
    for i, x in enumerate(xs):
        await queue.start_async({"x": x}, userdata=i)
    await queue.wait_all()
    assert sorted(got) == list(range(9))
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i], reference(model, x), rtol=1e-4, atol=1e-5)
    assert queue.is_ready()


async def test_queue_reraises_job_and_callback_errors_once(small):
    _, compiled = small
    queue = ai.AsyncInferQueue(compiled, jobs=1)

    def callback(request, userdata):
        if userdata == "bad":
            raise ValueError("callback failed for bad")

    queue.set_callback(callback)
    await queue.start_async({"x": inputs(1)}, userdata="bad")
    with pytest.raises(ValueError, match="callback failed"):
        await queue.wait_all()
    await queue.start_async({"x": inputs(1)}, userdata="good")
    await queue.wait_all()
    with pytest.raises(ai.InputShapeError):
        await queue.start_async({"x": np.zeros((2, 3), np.float32)})
    await queue.start_async({"x": inputs(2)})
    await queue.wait_all()
    assert queue.userdata[0] is None


async def test_queue_jobs_zero_uses_the_optimal_number(small):
    _, compiled = small
    optimal = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    assert optimal >= compiled.get_property("NUM_STREAMS") >= 1
    assert len(ai.AsyncInferQueue(compiled)) == optimal


async def test_closing_the_queue_cancels_running_jobs(slow):
    _, compiled = slow
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        rows = 64
        while True:  # the control: the same two jobs, to the end; long enough to time
            start = time.perf_counter()
            await queue.start_async({"x": inputs(1, rows)})
            await queue.start_async({"x": inputs(2, rows)})
            await queue.wait_all()
            full = time.perf_counter() - start
            if full > 0.2 or rows >= 4096:  # an engine may run the chain in microseconds
                break
            rows *= 4
        await queue.start_async({"x": inputs(1, rows)})
        await queue.start_async({"x": inputs(2, rows)})
        await anyio.sleep(full / 10)  # computing
        start = time.perf_counter()
    assert time.perf_counter() - start < full / 2, full
    assert all(queue[i].state is ai.RequestState.CLOSED for i in range(2))
    assert all(isinstance(queue[i].error, ai.InferCancelledError) for i in range(2))
    with pytest.raises(ai.RequestClosedError):
        await queue.start_async({"x": inputs(1)})


def _feeds(value: int, rows: int = 2) -> dict[str, np.ndarray]:
    """Inputs of :func:`~aioinfer.testing.models.accumulator_model` (without state)."""
    x = np.full((rows, 4), value, np.int64)
    return {"x": x, "past": x}


async def test_a_failed_job_reaches_the_caller_once_and_stays_on_its_request(core, device):
    compiled = core.compile_model(reshape_model(), device)
    queue = ai.AsyncInferQueue(compiled, jobs=2)
    seen: list[tuple[str, BaseException | None]] = []
    queue.set_callback(lambda request, userdata: seen.append((userdata, request.error)))
    values = np.arange(6, dtype=np.float32)
    await queue.start_async({"x": values, "shape": np.array([4, 4], np.int64)}, "bad")
    await queue.start_async({"x": values, "shape": np.array([2, 3], np.int64)}, "good")
    with pytest.raises(ai.InferenceError, match="reshape_node"):
        await queue.wait_all()
    await queue.wait_all()  # raised once
    bad, good = queue.userdata.index("bad"), queue.userdata.index("good")
    # As OpenVINO's request does, the job's request raises its error until its next job.
    assert isinstance(queue[bad].error, ai.InferenceError)
    with pytest.raises(ai.InferenceError, match="reshape_node"):
        await queue[bad].wait()
    with pytest.raises(ai.InferenceError, match="reshape_node"):
        await queue[bad].wait_for(0)
    assert queue[good].error is None and await queue[good].wait_for(0)
    np.testing.assert_array_equal(queue[good].results["y"], values.reshape(2, 3))
    # The callback is told of every job, the failed one with its error.
    assert sorted(userdata for userdata, _ in seen) == ["bad", "good"]
    assert [userdata for userdata, error in seen if error is not None] == ["bad"]
    await queue.start_async({"x": values, "shape": np.array([3, 2], np.int64)}, "again")
    await queue.wait_all()
    again = queue.userdata.index("again")
    assert await queue[again].wait_for(0)
    np.testing.assert_array_equal((await queue[again].wait())["y"], values.reshape(3, 2))
    await queue.close()


async def test_get_idle_request_id_raises_an_earlier_job_error_once(every_accumulator):
    _, compiled = every_accumulator
    queue = ai.AsyncInferQueue(compiled, jobs=1)

    def callback(request, userdata):
        if userdata == "bad":
            raise ValueError("callback failed for bad")

    queue.set_callback(callback)
    await queue.start_async(_feeds(1), userdata="bad")
    # The only request is busy: this waits for its job, then raises what its callback
    # raised, as OpenVINO's get_idle_request_id does.
    with pytest.raises(ValueError, match="callback failed for bad"):
        await queue.get_idle_request_id()
    assert await queue.get_idle_request_id() == 0  # raised once
    with pytest.raises(ValueError, match="callback failed for bad"):
        await queue[0].wait()  # the request keeps it until its next job
    await queue.start_async(_feeds(2), userdata="good")
    await queue.wait_all()
    assert await queue[0].wait_for(0)
    np.testing.assert_array_equal(queue[0].results["y"], np.full((2, 4), 4))
    await queue.close()


async def test_get_idle_request_id_while_every_request_is_busy(every_accumulator):
    _, compiled = every_accumulator
    queue = ai.AsyncInferQueue(compiled, jobs=2)
    for i in range(len(queue)):
        await queue.start_async(_feeds(i))
    await queue.wait_all()
    assert [await request.wait_for(0) for request in queue] == [True, True]
    for i in range(10):  # OpenVINO's own test of get_idle_request_id, awaited
        idle = await queue.get_idle_request_id()
        assert queue[idle].state is ai.RequestState.IDLE
        assert await queue[idle].wait_for(0)
        await queue.start_async(_feeds(i), userdata=i)
        assert queue.userdata[idle] == i  # the request it named ran the job
    await queue.wait_all()
    for request in queue:
        assert await request.wait_for(0)
        np.testing.assert_array_equal(request.results["y"], np.full((2, 4), 2 * request.userdata))
    await queue.close()
