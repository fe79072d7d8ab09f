"""AsyncInferQueue on each device: every job once, errors re-raised once, the optimal
number of requests, closing cancels."""

from __future__ import annotations

import time

import anyio
import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.models import inputs, reference

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
