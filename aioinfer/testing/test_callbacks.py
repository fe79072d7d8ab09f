"""Callbacks: after the outputs are ready, with their userdata, sync ones off the loop,
async ones awaited; told of failures and cancellations; their exceptions surfaced."""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.models import SIZE, inputs

pytestmark = pytest.mark.anyio


async def test_sync_callback_runs_off_loop_after_outputs(small):
    _, compiled = small
    request = compiled.create_infer_request()
    seen = []
    loop_thread = threading.get_ident()

    def callback(req, userdata):
        seen.append((userdata, req.results["y"].shape, threading.get_ident() != loop_thread))

    request.set_callback(callback, "default")
    await request.infer({"x": inputs(1)})
    request.start_async({"x": inputs(2, rows=2)}, userdata="given")
    await request.wait()
    assert seen == [("default", (4, SIZE), True), ("given", (2, SIZE), True)]


async def test_async_callback_is_awaited_before_wait_returns(small):
    _, compiled = small
    request = compiled.create_infer_request()
    events = []

    async def callback(req, userdata):
        await anyio.sleep(0.01)
        events.append(("callback", userdata, req.error))

    request.set_callback(callback, "data")
    request.start_async({"x": inputs(1)})
    await request.wait()
    events.append(("waited", None, None))
    assert events == [("callback", "data", None), ("waited", None, None)]


async def test_callback_exception_is_surfaced_and_request_recovers(small):
    _, compiled = small
    request = compiled.create_infer_request()

    def callback(req, userdata):
        raise RuntimeError("boom in callback")

    request.set_callback(callback)
    with pytest.raises(RuntimeError, match="boom in callback"):
        await request.infer({"x": inputs(1)})
    request.set_callback(None)
    assert (await request.infer({"x": inputs(1)}))["y"].shape == (4, SIZE)


async def test_callback_told_of_cancellation_and_failure(slow, small):
    _, compiled = slow
    request = compiled.create_infer_request()
    errors = []
    request.set_callback(lambda req, _: errors.append(type(req.error)))
    request.start_async({"x": inputs(1, 64)})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    assert errors == [ai.InferCancelledError]

    _, small_compiled = small
    failing = small_compiled.create_infer_request()
    failures = []
    failing.set_callback(lambda req, _: failures.append(req.error))
    # A failure in a stage (here: the input check of infer_preprocess) reaches it too.
    with pytest.raises(ai.MissingInputError):
        await failing.infer()
    assert len(failures) == 1 and isinstance(failures[0], ai.MissingInputError)
    assert not np.isnan((await failing.infer({"x": inputs(1)}))["y"]).any()
