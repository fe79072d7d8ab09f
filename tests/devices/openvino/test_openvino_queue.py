"""AsyncInferQueue on the OPENVINO device, which runs it with its own engine
(aioinfer/devices/openvino/queue_engine.py): a job queued while every request is busy
starts in OpenVINO's completion callback of the request that became free (or on the
failure watch's thread after a failure), in the order the jobs came, and the loop hears
of the jobs in batches.

Results are compared with onnxruntime (float32: rtol 1e-4, atol 1e-5, other summation
orders). The conformance suite's queue tests run on OPENVINO too (tests/behaviour).
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.devices.openvino.queue_engine import QUEUED_PER_REQUEST
from tests import helpers
from tests.helpers import make_model, reference_outputs, tensor_info

pytestmark = pytest.mark.anyio

F32 = {"rtol": 1e-4, "atol": 1e-5}
THREAD_NAME = "aioinfer-openvino-queue"
QUEUED = [f"queued {n}" for n in range(QUEUED_PER_REQUEST)]
"""The userdata of as many jobs as one busy request's queue takes."""


def rows(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def slow_model() -> Any:
    """200 x (MatMul 256x256, Tanh) over ["n", 256]: milliseconds on 64 rows."""
    return helpers.chain_model(200, 256, seed=5)


def add_model() -> Any:
    """``y = a + b`` over dynamic lengths: OpenVINO fails when they differ."""
    return make_model(
        [oh.make_node("Add", ["a", "b"], ["y"], name="add_node")],
        [tensor_info("a", np.float32, ["n"]), tensor_info("b", np.float32, ["m"])],
        [tensor_info("y", np.float32, ["k"])],
    )


def slow_add_model() -> Any:
    """:func:`slow_model` (``x`` to ``y``) beside :func:`add_model`'s ``Add`` (``a`` and
    ``b`` to ``z``): a job that runs long, or one that fails."""
    model = slow_model()
    model.graph.node.append(oh.make_node("Add", ["a", "b"], ["z"], name="add_node"))
    model.graph.input.extend(
        [tensor_info("a", np.float32, ["n2"]), tensor_info("b", np.float32, ["m2"])]
    )
    model.graph.output.append(tensor_info("z", np.float32, ["k2"]))
    return model


async def job_seconds(compiled: ai.CompiledModel, feeds: dict[str, np.ndarray]) -> float:
    """Seconds one job takes on a fresh one-request queue (after a warm-up)."""
    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        await queue.start_async(feeds)
        await queue.wait_all()
        start = time.perf_counter()
        await queue.start_async(feeds)
        await queue.wait_all()
        return time.perf_counter() - start


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_each_job_completes_once_with_its_results_and_userdata(core, kind):
    model = helpers.chain_model(8, 32, seed=1)
    compiled = core.compile_model(model, "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    frames = [rows((4, 32), seed) for seed in range(40)]
    got: dict[int, np.ndarray] = {}
    threads: set[int] = set()

    def record(request: Any, userdata: int) -> None:
        assert userdata not in got
        assert request.userdata == userdata
        assert request.error is None
        got[userdata] = request.results["y"]
        threads.add(threading.get_ident())

    async def record_async(request: Any, userdata: int) -> None:
        record(request, userdata)

    frame = np.empty((4, 32), np.float32)  # one buffer, refilled for every job
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        queue.set_callback(record if kind == "sync" else record_async)
        for index, value in enumerate(frames):
            frame[...] = value
            await queue.start_async({"x": frame}, userdata=index)
            frame[...] = np.nan  # the job's inputs were copied
        await queue.wait_all()
        assert queue.is_ready()
        assert all(request.state is ai.RequestState.IDLE for request in queue)
    assert sorted(got) == list(range(len(frames)))
    for index, value in enumerate(frames):
        expected = reference_outputs(model, {"x": value})[0]
        np.testing.assert_allclose(got[index], expected, **F32)
    loop_thread = threading.get_ident()
    # A plain callback runs on the callback executor, a coroutine function on the loop.
    assert (loop_thread in threads) is (kind == "async")


async def test_without_a_callback_the_last_results_stay_on_each_request(core):
    model = helpers.chain_model(8, 32, seed=2)
    compiled = core.compile_model(model, "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    frames = [rows((3, 32), seed) for seed in range(30)]
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        for index, value in enumerate(frames):
            await queue.start_async({"x": value}, userdata=index)
        await queue.wait_all()
        for request in queue:
            index = request.userdata
            assert queue.userdata[list(queue).index(request)] == index
            expected = reference_outputs(model, {"x": frames[index]})[0]
            np.testing.assert_allclose(request.results["y"], expected, **F32)
            np.testing.assert_allclose(request.get_tensor("y"), expected, **F32)


async def test_a_waiting_job_starts_while_the_event_loop_is_busy(core):
    """When a job ends, the job queued for its request starts on OpenVINO's side while
    the loop is still blocked, on the inputs it was given (copied when it was queued:
    the change below, after ``start_async`` returned, is not seen)."""
    compiled = core.compile_model(slow_model(), "OPENVINO")
    first = {"x": rows((64, 256), 0)}
    took = await job_seconds(compiled, first)
    waiting = rows((8, 256), 1)
    original = waiting.copy()
    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        await queue.start_async(first, userdata="first")
        async with anyio.create_task_group() as group:
            group.start_soon(queue.start_async, {"x": waiting}, "waiting")
            await anyio.wait_all_tasks_blocked()  # the job is queued
            time.sleep(20 * took + 0.2)  # blocks the loop well past the first job's end
            waiting[...] = 0.0  # what the generic queue would have read
        await queue.wait_all()
        result = queue[0].results["y"]
    expected = reference_outputs(slow_model(), {"x": original})[0]
    np.testing.assert_allclose(result, expected, **F32)


async def test_jobs_queued_while_every_request_is_busy_start_in_order(core):
    """While every request is busy, ``start_async`` checks its job, copies its inputs,
    queues it and returns before any request frees; a job beyond the queue's room waits
    for room. They start in the order they came, each on its own inputs."""
    compiled = core.compile_model(slow_model(), "OPENVINO")
    done: list[str] = []
    outputs: dict[str, np.ndarray] = {}
    expected: dict[str, np.ndarray] = {}

    def record(request: Any, userdata: str) -> None:
        done.append(userdata)
        outputs[userdata] = request.results["y"].copy()

    seeds = dict(zip([*QUEUED, "later"], range(2, 99)))
    for name, seed in seeds.items():
        expected[name] = reference_outputs(slow_model(), {"x": rows((4, 256), seed)})[0]
    buffer = rows((4, 256), 0)  # one caller buffer, refilled after each start_async
    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        queue.set_callback(record)
        await queue.start_async({"x": rows((512, 256), 1)}, userdata="first")
        for name in QUEUED:
            buffer[...] = rows((4, 256), seeds[name])
            await queue.start_async({"x": buffer}, userdata=name)
        assert done == []  # queued: the first job still runs (seconds of compute)
        assert queue.userdata == ["first"]
        buffer[...] = rows((4, 256), seeds["later"])
        async with anyio.create_task_group() as group:
            group.start_soon(queue.start_async, {"x": buffer}, "later")  # no room: waits
        buffer[...] = 0.0
        await queue.wait_all()
    assert done == ["first", *QUEUED, "later"]
    for name, value in expected.items():
        np.testing.assert_allclose(outputs[name], value, **F32)


async def test_no_queued_job_is_stranded_while_the_loop_is_blocked(core):
    """With two requests busy and jobs queued, the completion callbacks drain the queue
    on OpenVINO's side with the loop blocked: whichever request ends last takes what
    is left; the loop then publishes each request's last job."""
    compiled = core.compile_model(slow_model(), "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    names = [f"job {n}" for n in range(2 * QUEUED_PER_REQUEST)]
    feeds = {name: rows((16, 256), seed) for seed, name in enumerate(names, start=2)}
    feeds.update(a=rows((256, 256), 0), b=rows((256, 256), 1))  # long jobs
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        await queue.start_async({"x": feeds["a"]}, userdata="a")
        await queue.start_async({"x": feeds["b"]}, userdata="b")
        for name in names:
            await queue.start_async({"x": feeds[name]}, userdata=name)
        assert queue.userdata == ["a", "b"]  # none started yet: both requests busy
        helpers.wait_until(  # blocks the loop: only OpenVINO's threads start jobs
            lambda: queue.is_ready(), 30, "the queued jobs to run on OpenVINO's side"
        )
        await queue.wait_all()
        last = list(queue.userdata)
        assert names[-1] in last
        for index, name in enumerate(last):
            if name not in names:
                continue  # a long job outlasted the queue: checked elsewhere
            want = reference_outputs(slow_model(), {"x": feeds[name]})[0]
            np.testing.assert_allclose(queue[index].results["y"], want, **F32)


async def test_failures_are_raised_once_and_the_queue_goes_on(core):
    compiled = core.compile_model(add_model(), "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    good = {"a": np.ones(3, np.float32), "b": np.full(3, 2, np.float32)}
    bad = {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    errors: list[Any] = []
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        queue.set_callback(lambda request, userdata: errors.append((userdata, request.error)))
        raised: list[ai.InferenceError] = []
        index = 0
        while index < 6:
            try:  # the next start_async or wait_all raises the failure
                await queue.start_async(bad if index == 3 else good, userdata=index)
                index += 1
            except ai.InferenceError as exc:
                raised.append(exc)
        try:
            await queue.wait_all()
        except ai.InferenceError as exc:
            raised.append(exc)
        await queue.wait_all()
        assert len(raised) == 1
        assert "'add_node' failed in OpenVINO" in str(raised[0])
        assert sorted(u for u, _ in errors) == list(range(6))
        assert [u for u, e in errors if e is not None] == [3]
        with pytest.raises(ai.InputTypeError, match="'a'"):
            await queue.start_async({"a": np.ones(3, np.int64), "b": good["b"]})
        for index in range(4):
            await queue.start_async(good, userdata=10 + index)
        await queue.wait_all()
        assert [request.results["y"].tolist() for request in queue] == [[3, 3, 3]] * 2


async def test_a_waiting_job_with_bad_inputs_is_refused_and_the_queue_goes_on(core):
    compiled = core.compile_model(slow_model(), "OPENVINO")
    feeds = {"x": rows((64, 256), 0)}
    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        await queue.start_async(feeds, userdata="running")
        # Waits for the running job, then is refused (on the request's thread, or on
        # the loop if that job was already over).
        with pytest.raises(ai.InputShapeError, match="'x'"):
            await queue.start_async({"x": rows((4, 3), 1)}, userdata="bad")
        await queue.start_async({"x": rows((4, 256), 2)}, userdata="after")
        await queue.wait_all()
        assert queue.userdata == ["after"]
        assert queue[0].results["y"].shape == (4, 256)


async def test_cancelling_a_waiting_start_async_drops_its_job(core):
    compiled = core.compile_model(slow_model(), "OPENVINO")
    feeds = {"x": rows((64, 256), 0)}
    done: list[str] = []
    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        queue.set_callback(lambda request, userdata: done.append(userdata))
        await queue.start_async(feeds, userdata="running")
        for name in QUEUED:  # queued at once: the queue is full then
            await queue.start_async(feeds, userdata=name)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await queue.start_async(feeds, userdata="dropped")
        assert scope.cancelled_caught
        await queue.wait_all()
        assert done == ["running", *QUEUED]
        await queue.start_async(feeds, userdata="next")
        await queue.wait_all()
    assert done == ["running", *QUEUED, "next"]


async def test_close_cancels_running_jobs_and_refuses_waiting_ones(core):
    compiled = core.compile_model(slow_model(), "OPENVINO")
    feeds = {"x": rows((256, 256), 0)}
    outcome: list[BaseException] = []
    queue = ai.AsyncInferQueue(compiled, jobs=1)

    async def wait_for_the_request() -> None:
        try:
            await queue.start_async(feeds, userdata="waiting")
        except ai.RequestClosedError as exc:
            outcome.append(exc)

    done: list[str] = []
    queue.set_callback(lambda request, userdata: done.append(userdata))
    await queue.start_async(feeds, userdata="running")
    for name in QUEUED:  # dropped by close(), never run
        await queue.start_async(feeds, userdata=name)
    async with anyio.create_task_group() as group:
        group.start_soon(wait_for_the_request)
        await anyio.wait_all_tasks_blocked()
        await queue.close()
    assert len(outcome) == 1
    assert queue[0].state is ai.RequestState.CLOSED
    assert isinstance(queue[0].error, ai.InferCancelledError)
    assert queue[0].userdata == "running"
    assert done == ["running"]
    with pytest.raises(ai.RequestClosedError):
        await queue.start_async(feeds)
    with pytest.raises(ai.RequestClosedError):
        await queue.get_idle_request_id()


async def test_closing_the_compiled_model_closes_its_queues(core):
    compiled = core.compile_model(slow_model(), "OPENVINO")
    queue = ai.AsyncInferQueue(compiled, jobs=1)
    await queue.start_async({"x": rows((256, 256), 0)}, userdata="running")
    await compiled.close()
    assert queue[0].state is ai.RequestState.CLOSED
    assert isinstance(queue[0].error, ai.InferCancelledError)
    with pytest.raises(ai.RequestClosedError):
        await queue.start_async({"x": rows((4, 256), 1)})


async def test_get_idle_request_id_waits_for_a_request(core):
    compiled = core.compile_model(slow_model(), "OPENVINO")
    feeds = {"x": rows((64, 256), 0)}
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        first = await queue.get_idle_request_id()
        await queue.start_async(feeds)
        assert queue[first].state is ai.RequestState.BUSY
        second = await queue.get_idle_request_id()
        assert second != first
        await queue.start_async(feeds)
        assert not queue.is_ready()
        assert await queue.get_idle_request_id() in (0, 1)
        await queue.wait_all()
        assert queue.is_ready()


async def test_a_queue_left_unclosed_stops_its_thread(core):
    """Its failure watch (one thread per queue) ends once the queue is collected."""
    compiled = core.compile_model(helpers.chain_model(4, 16), "OPENVINO")

    def running() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name == THREAD_NAME}

    before = running()
    queue = ai.AsyncInferQueue(compiled, jobs=3)
    await queue.start_async({"x": rows((2, 16), 0)})
    await queue.wait_all()
    threads = running() - before
    assert len(threads) == 1
    del queue

    def ended() -> bool:
        gc.collect()  # the thread may still hold the queue for a moment
        return not any(thread.is_alive() for thread in threads)

    helpers.wait_until(ended, 30, "the queue's thread to end")


async def test_a_stateful_model_keeps_each_requests_state(core):
    """A stateful model's queue runs the generic path: each request accumulates."""
    model = helpers.accumulator_model(width=2)
    compiled = core.compile_model(model, "OPENVINO", {"STATEFUL": {"past": "present"}})
    ones = np.ones((1, 2), np.int64)
    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        for _ in range(3):
            await queue.start_async({"x": ones})
        await queue.wait_all()
        assert queue[0].results["y"].tolist() == [[3, 3]]


async def test_jobs_ended_while_the_loop_was_blocked_are_published_in_order(core):
    """With the loop blocked, each job ends on OpenVINO's side and starts the next
    queued one (after a failure too, which no OpenVINO callback reports: the failure
    watch finds it); the loop then publishes the batch in order, and a job waiting for
    room in the queue goes on."""
    compiled = core.compile_model(slow_add_model(), "OPENVINO")
    x = rows((1, 256), 0)

    def job(a: float, b_size: int) -> dict[str, np.ndarray]:
        return {"x": x, "a": np.full(3, a, np.float32), "b": np.full(b_size, 2, np.float32)}

    good, bad, last = job(1, 3), job(1, 2), job(5, 3)
    long_job = {**good, "x": rows((512, 256), 1)}
    returned: list[str] = []

    async def start(queue: ai.AsyncInferQueue, feeds: dict[str, np.ndarray], name: str) -> None:
        await queue.start_async(feeds, userdata=name)
        returned.append(name)

    async with ai.AsyncInferQueue(compiled, jobs=1) as queue:
        await queue.start_async(long_job, userdata="first")
        async with anyio.create_task_group() as group:
            for feeds, name in ((bad, "bad"), (good, "good"), (last, "last")):
                group.start_soon(start, queue, feeds, name)
                await anyio.wait_all_tasks_blocked()  # waiting, in this order
            queued = ["bad", "good", "last"][:QUEUED_PER_REQUEST]
            assert returned == queued  # queued at once; the others wait for room
            helpers.wait_until(  # the loop is blocked meanwhile
                lambda: queue.is_ready(), 30, "the jobs to end on OpenVINO's side"
            )
            assert returned == queued  # the loop has not run since
        assert sorted(returned) == ["bad", "good", "last"]  # in whichever order woken
        with pytest.raises(ai.InferenceError, match="'add_node' failed in OpenVINO"):
            await queue.wait_all()
        await queue.wait_all()  # raised once
        assert queue.userdata == ["last"]
        assert queue[0].results["z"].tolist() == [7, 7, 7]


async def test_a_failure_is_reported_when_no_other_job_ends(core):
    """OpenVINO calls no callback for a failed job: the failure watch ends it."""
    compiled = core.compile_model(add_model(), "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    bad = {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    errors: list[tuple[str, Any]] = []
    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        queue.set_callback(lambda request, userdata: errors.append((userdata, request.error)))
        await queue.start_async(bad, userdata="one")
        await queue.start_async(bad, userdata="two")
        with pytest.raises(ai.InferenceError, match="'add_node' failed in OpenVINO"):
            await queue.wait_all()
        assert sorted(u for u, _ in errors) == ["one", "two"]
        assert all(isinstance(e, ai.InferenceError) for _, e in errors)
        assert all(request.state is ai.RequestState.IDLE for request in queue)


async def test_a_queue_dropped_with_jobs_in_flight_lives_until_they_ended(core):
    """OpenVINO's requests are not freed under a running job (its callback would wait
    for the GIL the freeing thread holds)."""
    compiled = core.compile_model(slow_model(), "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    feeds = {"x": rows((8192, 256), 0)}  # seconds: still running after the collection
    queue = ai.AsyncInferQueue(compiled, jobs=2)
    await queue.start_async(feeds)
    await queue.start_async(feeds)
    engine = weakref.ref(queue._engine)
    syncs = [request._request.ov_request for request in queue]
    del queue
    gc.collect()
    assert engine() is not None
    assert not all(sync.wait_for(0) for sync in syncs)  # still running

    def collected() -> bool:
        gc.collect()
        return engine() is None

    helpers.wait_until(collected, 30, "the queue to be collected")


def thread_states() -> int:
    """How many Python thread states the interpreter has (CPython's C API)."""
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    count, state = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while state:
        count, state = count + 1, api.PyThreadState_Next(state)
    return count


async def test_openvino_threads_keep_their_python_thread_state(core):
    """OpenVINO's binding would make and free a thread state for every completion
    callback (about 14 µs of CPU per tiny-CNN job); the queue keeps the first one of each OpenVINO
    thread, and uses it for the next callbacks (no more states made)."""
    compiled = core.compile_model(helpers.chain_model(4, 16), "OPENVINO")

    def foreign_states() -> int:  # those of threads that Python did not start
        return thread_states() - threading.active_count()

    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        for index in range(20):
            await queue.start_async({"x": rows((2, 16), index)})
        await queue.wait_all()
        kept = foreign_states()
        for index in range(20):
            await queue.start_async({"x": rows((2, 16), index)})
        await queue.wait_all()
        assert foreign_states() == kept
    assert kept >= 1


EXIT_WITH_JOBS_IN_FLIGHT = """
import asyncio
import numpy as np
import aioinfer as ai
from tests import helpers

async def main():
    compiled = ai.Core().compile_model(helpers.chain_model(200, 256), "OPENVINO")
    queue = ai.AsyncInferQueue(compiled, jobs=2)
    x = np.ones((256, 256), np.float32)
    await queue.start_async({"x": x})
    await queue.start_async({"x": x})
    return queue  # its jobs still run when the interpreter exits

kept = asyncio.run(main())
"""


def test_exiting_with_jobs_in_flight_does_not_abort(tmp_path):
    """A queue's jobs are no tasks that asyncio.run cancels: a request's thread that
    came back from OpenVINO's wait() while the interpreter finalized aborted the
    process (most exits); the jobs are now cancelled and the threads ended first."""
    root = Path(__file__).resolve().parents[3]
    script = tmp_path / "exit_in_flight.py"
    script.write_text(EXIT_WITH_JOBS_IN_FLIGHT)
    env = {**os.environ, "PYTHONPATH": str(root)}
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=root, env=env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
