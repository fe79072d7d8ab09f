"""CPU-specific async runtime tests (the behaviour every device shares is the conformance
suite, aioinfer.testing, run for every device by tests/behaviour/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import onnx
import pytest

import aioinfer as ai
from aioinfer.testing.models import SIZE, chain_model, inputs, reference
from tests.helpers import replace_compute_stage

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def small() -> tuple[onnx.ModelProto, ai.CompiledModel]:
    model = chain_model(3)
    return model, ai.Core().compile_model(model, "CPU")


@pytest.fixture(scope="module")
def slow() -> tuple[onnx.ModelProto, ai.CompiledModel]:
    model = chain_model(400)
    return model, ai.Core().compile_model(model, "CPU")


async def test_cancel_before_compute_skips_it(small):
    model, compiled = small
    request = compiled.create_infer_request()
    ran = []
    original = request._request.start_pipeline
    request._request.start_pipeline = lambda: (ran.append(1), original())  # type: ignore[method-assign]
    replace_compute_stage(request, request._request.start_pipeline)
    request.start_async({"x": inputs(1)})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    assert ran == []
    x = inputs(2)
    results = await request.infer({"x": x})
    assert ran == [1]
    np.testing.assert_allclose(results["y"], reference(model, x), rtol=1e-4, atol=1e-5)


def test_properties_follow_the_hint():
    core = ai.Core()
    latency = core.compile_model(chain_model(1), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    throughput = core.compile_model(chain_model(1), "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})
    cores = core.get_property("CPU", "NUM_CORES")
    assert latency.get_property("NUM_STREAMS") == 1
    assert latency.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 1
    assert throughput.get_property("NUM_STREAMS") == cores
    # Auto-batched (BATCH:CPU): rows for 16-row batches in each of the CPU's 2 x cores.
    assert throughput.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 2 * cores * 16
    plain = core.compile_model(
        chain_model(1), "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "ALLOW_AUTO_BATCHING": "NO"}
    )
    assert plain.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 2 * cores
    explicit = core.compile_model(chain_model(1), "CPU", {"NUM_STREAMS": 3})
    assert explicit.get_property("NUM_STREAMS") == 3
    assert explicit.task_executor.workers == 3
    for name in ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS"):
        assert name in latency.get_property("SUPPORTED_PROPERTIES")
    with pytest.raises(ai.InvalidPropertyValueError, match="PERFORMANCE_HINT"):
        core.compile_model(chain_model(1), "CPU", {"PERFORMANCE_HINT": "FAST"})


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_nothing_hangs_at_interpreter_exit(backend):
    script = f"""
import anyio, numpy as np, aioinfer as ai
from tests.test_async import chain_model, inputs
compiled = ai.Core().compile_model(chain_model(400), "CPU")
async def main():
    request = compiled.create_infer_request()
    request.start_async({{"x": inputs(1, 64)}})
    await anyio.sleep(0.05)
anyio.run(main, backend={backend!r})
print("exited")
"""
    # A hang guard only: a hung exit never ends; a loaded machine only slows the start.
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "exited" in done.stdout


async def test_cancelled_during_async_callback_the_callback_finishes(small):
    """The inference completed before its callback: cancelling the awaiting task then
    neither interrupts the callback nor turns the inference into a cancelled one."""
    _, compiled = small
    request = compiled.create_infer_request()
    started = anyio.Event()
    told = []

    async def slow_callback(req, userdata):
        started.set()
        await anyio.sleep(0.05)
        told.append(req.error)

    request.set_callback(slow_callback)
    got = []

    async def infer() -> None:
        got.append(await request.infer({"x": inputs(1)}))

    with anyio.move_on_after(60) as scope:  # a hang guard
        async with anyio.create_task_group() as tg:
            tg.start_soon(infer)
            await started.wait()
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert told == [None] and request.error is None
    assert len(got) == 1 and got[0]["y"].shape == (4, SIZE)
    assert request.state is ai.RequestState.IDLE
    request.set_callback(None)
    assert (await request.infer({"x": inputs(2)}))["y"].shape == (4, SIZE)
