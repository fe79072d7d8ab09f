"""The async runtime: state machine, cancellation, callbacks, queue, executors, lifetime."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import aioinfer as ai

pytestmark = pytest.mark.anyio

SIZE = 384
ROOT = Path(__file__).resolve().parent.parent


def chain_model(steps: int) -> onnx.ModelProto:
    """x -> (MatMul W, Tanh) * steps: a plan of 2*steps kernels, each well under 10 ms."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((SIZE, SIZE)) / np.sqrt(SIZE)).astype(np.float32)
    nodes, last = [], "x"
    for i in range(steps):
        nodes.append(oh.make_node("MatMul", [last, "w"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(oh.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        last = f"t{i}"
    nodes.append(oh.make_node("Identity", [last], ["y"]))
    graph = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", SIZE])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", SIZE])],
        [numpy_helper.from_array(weight, "w")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def small() -> tuple[onnx.ModelProto, ai.CompiledModel]:
    model = chain_model(3)
    return model, ai.Core().compile_model(model, "CPU")


@pytest.fixture(scope="module")
def slow() -> tuple[onnx.ModelProto, ai.CompiledModel]:
    model = chain_model(400)
    return model, ai.Core().compile_model(model, "CPU")


def reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def inputs(seed: int, rows: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, SIZE)).astype(np.float32)


async def run_for(slow_compiled: ai.CompiledModel) -> float:
    request = slow_compiled.create_infer_request()
    start = time.perf_counter()
    await request.infer({"x": inputs(1, 64)})
    return time.perf_counter() - start


async def test_busy_request_raises_at_once(slow):
    _, compiled = slow
    request = compiled.create_infer_request()
    request.start_async({"x": inputs(1, 64)})
    assert request.state is ai.RequestState.BUSY
    with pytest.raises(ai.RequestBusyError, match="already running"):
        request.start_async({"x": inputs(2)})
    with pytest.raises(ai.RequestBusyError):
        await request.infer({"x": inputs(2)})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    assert request.state is ai.RequestState.IDLE


async def test_start_async_then_wait_returns_results(small):
    model, compiled = small
    request = compiled.create_infer_request()
    x = inputs(3)
    request.start_async({"x": x})
    results = await request.wait()
    assert results is not None
    np.testing.assert_allclose(results["y"], reference(model, x), rtol=1e-4, atol=1e-5)
    assert request.state is ai.RequestState.IDLE


async def test_wait_for_times_out_without_cancelling(slow):
    _, compiled = slow
    request = compiled.create_infer_request()
    request.start_async({"x": inputs(1, 64)})
    assert await request.wait_for(0.001) is False
    assert request.state is ai.RequestState.BUSY
    assert await request.wait_for(60) is True
    assert request.results is not None and request.error is None


async def test_cancelling_the_awaiting_task_stops_compute_and_request_is_reusable(slow):
    model, compiled = slow
    full = await run_for(compiled)
    request = compiled.create_infer_request()
    with anyio.move_on_after(full / 10) as scope:
        await request.infer({"x": inputs(1, 64)})
    assert scope.cancelled_caught
    # The cancelled step let go quickly: the request is idle right away.
    assert request.state is ai.RequestState.IDLE
    assert isinstance(request.error, ai.InferCancelledError)
    x = inputs(5)
    results = await request.infer({"x": x})
    np.testing.assert_allclose(results["y"], reference(model, x), rtol=1e-4, atol=1e-5)


async def test_cancel_stops_within_a_kernel(slow):
    _, compiled = slow
    full = await run_for(compiled)
    request = compiled.create_infer_request()
    request.start_async({"x": inputs(1, 64)})
    await anyio.sleep(full / 10)
    start = time.perf_counter()
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    stopped_after = time.perf_counter() - start
    # 800 kernels: one kernel is ~full/800; allow generous slack for a loaded machine.
    assert stopped_after < full / 4, (stopped_after, full)


async def test_cancel_before_compute_skips_it(small):
    model, compiled = small
    request = compiled.create_infer_request()
    ran = []
    original = request._request.start_pipeline
    request._request.start_pipeline = lambda: (ran.append(1), original())  # type: ignore[method-assign]
    request._pipeline[1] = (request._pipeline[1][0], request._request.start_pipeline)
    request.start_async({"x": inputs(1)})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    assert ran == []
    x = inputs(2)
    results = await request.infer({"x": x})
    assert ran == [1]
    np.testing.assert_allclose(results["y"], reference(model, x), rtol=1e-4, atol=1e-5)


async def test_cancelling_wait_cancels_the_inference(slow):
    _, compiled = slow
    request = compiled.create_infer_request()
    request.start_async({"x": inputs(1, 64)})
    with anyio.move_on_after(0.05):
        await request.wait()
    assert request.state is ai.RequestState.IDLE
    assert isinstance(request.error, ai.InferCancelledError)


async def test_sync_callback_runs_off_loop_after_outputs(small):
    _, compiled = small
    request = compiled.create_infer_request()
    seen = []
    loop_thread = threading.get_ident()

    def callback(req, userdata):
        seen.append((userdata, req.results["y"].shape, threading.get_ident() != loop_thread))

    request.set_callback(callback, "default")
    await request.infer({"x": inputs(1)})
    request.start_async({"x": inputs(2)}, userdata="given")
    await request.wait()
    assert seen == [("default", (4, SIZE), True), ("given", (4, SIZE), True)]


async def test_async_callback_is_awaited_before_wait_returns(small):
    _, compiled = small
    request = compiled.create_infer_request()
    events = []

    async def callback(req, userdata):
        await anyio.sleep(0.01)
        events.append(("callback", req.error))

    request.set_callback(callback)
    request.start_async({"x": inputs(1)})
    await request.wait()
    events.append(("waited", None))
    assert events == [("callback", None), ("waited", None)]


async def test_callback_exception_is_surfaced(small):
    _, compiled = small
    request = compiled.create_infer_request()

    def callback(req, userdata):
        raise RuntimeError("boom in callback")

    request.set_callback(callback)
    with pytest.raises(RuntimeError, match="boom in callback"):
        await request.infer({"x": inputs(1)})
    request.set_callback(None)
    assert (await request.infer({"x": inputs(1)}))["y"].shape == (4, SIZE)


async def test_callback_told_of_failure_and_cancellation(slow):
    _, compiled = slow
    request = compiled.create_infer_request()
    errors = []
    request.set_callback(lambda req, _: errors.append(type(req.error)))
    request.start_async({"x": inputs(1, 64)})
    request.cancel()
    with pytest.raises(ai.InferCancelledError):
        await request.wait()
    assert errors == [ai.InferCancelledError]


async def test_queue_delivers_each_job_once_with_its_userdata(small):
    model, compiled = small
    queue = ai.AsyncInferQueue(compiled, jobs=2)
    assert len(queue) == 2
    got: dict[int, np.ndarray] = {}

    def callback(request, userdata):
        assert userdata not in got
        got[userdata] = request.results["y"].copy()

    queue.set_callback(callback)
    xs = [inputs(10 + i, rows=2) for i in range(9)]
    for i, x in enumerate(xs):
        await queue.start_async({"x": x}, userdata=i)
    await queue.wait_all()
    assert sorted(got) == list(range(9))
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i], reference(model, x), rtol=1e-4, atol=1e-5)
    assert queue.is_ready()


async def test_queue_reraises_job_and_callback_errors(small):
    _, compiled = small
    queue = ai.AsyncInferQueue(compiled, jobs=1)

    def callback(request, userdata):
        if userdata == "bad":
            raise ValueError("callback failed for bad")

    queue.set_callback(callback)
    await queue.start_async({"x": inputs(1)}, userdata="bad")
    with pytest.raises(ValueError, match="callback failed"):
        await queue.wait_all()
    # The error was raised once; the queue works on.
    await queue.start_async({"x": inputs(1)}, userdata="good")
    await queue.wait_all()
    with pytest.raises(ai.InputShapeError):
        await queue.start_async({"x": np.zeros((2, 3), np.float32)})
    await queue.start_async({"x": inputs(2)})
    await queue.wait_all()


async def test_queue_jobs_zero_uses_optimal_number(small):
    _, compiled = small
    queue = ai.AsyncInferQueue(compiled)
    assert len(queue) == compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")


async def test_closing_queue_cancels_running_jobs(slow):
    _, compiled = slow
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        await queue.start_async({"x": inputs(1, 64)})
        await queue.start_async({"x": inputs(2, 64)})
        start = time.perf_counter()
    assert time.perf_counter() - start < 2.0
    assert all(queue[i].state is ai.RequestState.CLOSED for i in range(2))
    with pytest.raises(ai.RequestClosedError):
        await queue.start_async({"x": inputs(1)})


async def test_closed_request_and_compiled_model_refuse_work():
    compiled2 = ai.Core().compile_model(chain_model(1), "CPU")
    async with compiled2.create_infer_request() as request:
        await request.infer({"x": inputs(1)})
    with pytest.raises(ai.RequestClosedError):
        await request.infer({"x": inputs(1)})
    await compiled2.close()
    with pytest.raises(ai.RequestClosedError):
        compiled2.create_infer_request()


async def loop_delays_while_computing(compiled: ai.CompiledModel) -> list[float]:
    """Delays of a 1 ms ticker while three requests compute."""
    requests = [compiled.create_infer_request() for _ in range(3)]
    delays: list[float] = []
    stop = anyio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await anyio.sleep(0.001)
            delays.append(time.perf_counter() - start - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        for r in requests:
            r.start_async({"x": inputs(1, 64)})
        for r in requests:
            await r.wait()
        stop.set()
    return delays


async def test_event_loop_stays_responsive_while_requests_compute(slow):
    # Other processes on a shared 2-core machine add their own delays: the best of three
    # measurements must show a p99 well under 10 ms.
    _, compiled = slow
    p99s = []
    for _ in range(3):
        delays = await loop_delays_while_computing(compiled)
        assert len(delays) > 20
        p99s.append(float(np.percentile(delays, 99)))
        if p99s[-1] < 0.005:
            break
    assert min(p99s) < 0.005, f"loop p99 delays {[round(p * 1000, 1) for p in p99s]} ms"


def test_properties_follow_the_hint():
    core = ai.Core()
    latency = core.compile_model(chain_model(1), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    throughput = core.compile_model(chain_model(1), "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})
    cores = core.get_property("CPU", "NUM_CORES")
    assert latency.get_property("NUM_STREAMS") == 1
    assert latency.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 1
    assert throughput.get_property("NUM_STREAMS") == cores
    assert throughput.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 2 * cores
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
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "exited" in done.stdout
    assert time.perf_counter() - start < 30


async def test_cancelled_during_async_callback_request_still_settles(small):
    _, compiled = small
    request = compiled.create_infer_request()
    started = anyio.Event()

    async def slow_callback(req, userdata):
        started.set()
        await anyio.sleep(10)

    request.set_callback(slow_callback)
    with anyio.move_on_after(5) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(request.infer, {"x": inputs(1)})
            await started.wait()
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert request.state is ai.RequestState.IDLE
    request.set_callback(None)
    assert (await request.infer({"x": inputs(2)}))["y"].shape == (4, SIZE)
