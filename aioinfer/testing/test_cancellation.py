"""Cancellation: of the awaiting task, by ``cancel()``, before the compute starts, of
``wait()``; the request is reusable at once and computes correctly afterwards."""

from __future__ import annotations

import time

import anyio
import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.models import SIZE, inputs, reference

pytestmark = pytest.mark.anyio

TOL = {"rtol": 1e-4, "atol": 1e-5}


async def full_run_seconds(compiled: ai.CompiledModel) -> float:
    request = compiled.create_infer_request()
    start = time.perf_counter()
    await request.infer({"x": inputs(1, 64)})
    return time.perf_counter() - start


async def test_cancelling_the_awaiting_task_stops_compute_and_request_is_reusable(slow, small):
    _, compiled = slow
    full = await full_run_seconds(compiled)
    request = compiled.create_infer_request()
    with anyio.move_on_after(full / 10) as scope:
        await request.infer({"x": inputs(1, 64)})
    assert scope.cancelled_caught
    # The compute let go before the cancellation reached us.
    assert request.state is ai.RequestState.IDLE
    assert isinstance(request.error, ai.InferCancelledError)
    # Reusable at once, with correct results (checked on the small model's request).
    model, small_compiled = small
    other = small_compiled.create_infer_request()
    with anyio.move_on_after(0):
        await other.infer({"x": inputs(1)})
    x = inputs(5)
    np.testing.assert_allclose((await other.infer({"x": x}))["y"], reference(model, x), **TOL)
    assert (await request.infer({"x": inputs(6, 2)}))["y"].shape == (2, SIZE)


async def test_cancel_stops_within_a_fraction_of_the_run(slow):
    _, compiled = slow
    full = await full_run_seconds(compiled)
    request = compiled.create_infer_request()
    request.start_async({"x": inputs(1, 64)})
    await anyio.sleep(full / 10)
    start = time.perf_counter()
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    elapsed = time.perf_counter() - start
    # 800 kernels: one kernel is ~full/800; generous slack for a loaded machine. The run
    # to compare with is the longer of one before and one after: a load that came up
    # meanwhile slows the cancelled run as much.
    full = max(full, await full_run_seconds(compiled))
    assert elapsed < full / 2, (elapsed, full)
    assert request.state is ai.RequestState.IDLE


async def test_cancel_right_after_start(small):
    model, compiled = small
    request = compiled.create_infer_request()
    errors = []
    request.set_callback(lambda req, _: errors.append(req.error))
    request.start_async({"x": inputs(1)})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    assert len(errors) == 1 and isinstance(errors[0], ai.InferCancelledError)
    x = inputs(2)
    results = await request.infer({"x": x})
    np.testing.assert_allclose(results["y"], reference(model, x), **TOL)
    assert request.error is None and errors[-1] is None


async def test_cancelling_wait_cancels_the_inference(slow):
    _, compiled = slow
    full = await full_run_seconds(compiled)  # an engine device may run it in tens of ms
    request = compiled.create_infer_request()
    request.start_async({"x": inputs(1, 64)})
    with anyio.move_on_after(full / 10) as scope:
        await request.wait()
    assert scope.cancelled_caught
    assert request.state is ai.RequestState.IDLE
    assert isinstance(request.error, ai.InferCancelledError)


async def test_cancel_when_idle_is_a_no_op(small):
    model, compiled = small
    request = compiled.create_infer_request()
    request.cancel()
    x = inputs(3)
    np.testing.assert_allclose((await request.infer({"x": x}))["y"], reference(model, x), **TOL)


async def test_cancel_reaches_the_sync_path_after_an_awaited_inference(slow):
    model, compiled = slow
    request = compiled.create_infer_request()
    start = time.perf_counter()
    await request.infer({"x": inputs(1, 64)})  # an awaited inference commits first
    full = time.perf_counter() - start
    outcome: list[BaseException] = []
    ended: list[bool] = []

    def infer_in_thread() -> None:
        try:
            request.infer_sync({"x": inputs(1, 64)})
        except ai.InferCancelledError as exc:
            outcome.append(exc)
        finally:
            ended.append(True)

    # A loaded machine may finish the inference before the cancel lands: try again,
    # sooner each time (a cancel that never reaches the synchronous path fails them all).
    for wait in (full / 10, full / 40, 0.0, 0.0, 0.0):
        ended.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, infer_in_thread)
            while request.state is not ai.RequestState.BUSY and not ended:
                await anyio.sleep(0)
            await anyio.sleep(wait)
            request.cancel()
        if outcome:
            break
    assert len(outcome) == 1, "cancel() did not reach the synchronous inference"
    assert request.state is ai.RequestState.IDLE
    x = inputs(2, 64)
    np.testing.assert_allclose(request.infer_sync({"x": x})["y"], reference(model, x), **TOL)
