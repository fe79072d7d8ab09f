"""A plan computing on a compute thread keeps the event loop's wait for the GIL short
through the interpreter's switch interval (``plan.keep_loop_responsive``), not through
offers of its own between kernels, which cost even when nobody wanted the GIL."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.devices.cpu import plan
from tests import helpers

pytestmark = pytest.mark.anyio


@pytest.fixture
def default_switch_interval() -> Iterator[None]:
    """The interpreter's default switch interval, and a process that has not lowered it
    yet; both restored afterwards."""
    saved, saved_flag = sys.getswitchinterval(), plan._responsive
    sys.setswitchinterval(0.005)
    plan._responsive = False
    try:
        yield
    finally:
        sys.setswitchinterval(saved)
        plan._responsive = saved_flag


def _request() -> ai.InferRequest:
    model = helpers.chain_model(3, 8)
    return ai.Core().compile_model(model, "CPU").create_infer_request()


def test_infer_sync_on_the_main_thread_leaves_the_switch_interval(default_switch_interval):
    request = _request()
    request.infer_sync({"x": np.ones((2, 8), np.float32)})
    assert sys.getswitchinterval() == pytest.approx(0.005)


async def test_an_awaited_inference_lowers_the_switch_interval_once(default_switch_interval):
    request = _request()
    x = np.ones((2, 8), np.float32)
    expected = _request().infer_sync({"x": x})[0]  # another compiled model's
    result = await request.infer({"x": x})  # the first run of its shapes: on a thread
    np.testing.assert_array_equal(result[0], expected)
    assert sys.getswitchinterval() == pytest.approx(plan.GIL_YIELD_SECONDS)
    sys.setswitchinterval(0.002)  # the application's own choice, made later, wins
    await request.infer({"x": x * 2})
    request.infer_sync({"x": x})
    assert sys.getswitchinterval() == pytest.approx(0.002)
