"""Inferences without a request of the caller's own: ``CompiledModel.infer`` (a pooled
request), ``BatchCompiledModel.infer`` / ``infer_timed`` (straight into the batcher),
``SyncInferRequest.validated``, ``queued_seconds``, and the batcher starting the next
batch before it answers the last one.

Exactness as in tests/devices/batch/test_batch.py: the int64 and elementwise ``exact_model`` is
compared bit for bit with unbatched runs (and its int64 output with onnx.reference);
float32 products go through BLAS, whose rounding depends on the rows of the batch, and
are compared with a tolerance.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import aioinfer as ai
from aioinfer.devices.batch import BatchCompiledModel
from aioinfer.plugin import SyncInferRequest
from tests.devices.batch.test_batch import exact_feeds, exact_model, gather_model
from tests.helpers import chain_model, mlp_model, reference_outputs, two_input_model

pytestmark = pytest.mark.anyio

WIDE = 256


@pytest.fixture(scope="module")
def exact_plain(core: ai.Core) -> ai.CompiledModel:
    return core.compile_model(exact_model(), "CPU")


def batch_model(core: ai.Core, **config: Any) -> BatchCompiledModel:
    compiled = core.compile_model(exact_model(), "BATCH:CPU", config)
    assert isinstance(compiled, BatchCompiledModel)
    return compiled


def single_rows(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    return [{k: v[:1] for k, v in feed.items()} for feed in exact_feeds(count, seed)]


def assert_exact(results: ai.InferResults, expected: ai.InferResults) -> None:
    for name in ("y", "t"):
        np.testing.assert_array_equal(results[name], expected[name], err_msg=name)


def count_created(compiled: ai.CompiledModel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-element list counting the device requests ``compiled`` creates from now on."""
    created = [0]
    make = compiled.create_sync_infer_request

    def counting() -> SyncInferRequest:
        created[0] += 1
        return make()

    monkeypatch.setattr(compiled, "create_sync_infer_request", counting)
    return created


async def gather(
    call: Callable[[dict[str, np.ndarray]], Any], feeds: Sequence[dict[str, np.ndarray]]
) -> list[Any]:
    """``await call(feed)`` for every feed at once: the result, or the exception raised."""
    outcomes: list[Any] = [None] * len(feeds)

    async def one(index: int) -> None:
        try:
            outcomes[index] = await call(feeds[index])
        except ai.AioinferError as exc:
            outcomes[index] = exc

    async with anyio.create_task_group() as group:
        for index in range(len(feeds)):
            group.start_soon(one, index)
    return outcomes


# -- BatchCompiledModel.infer: batched and exact ------------------------------------------


async def test_concurrent_direct_calls_are_batched_and_exact(core, exact_plain, monkeypatch):
    compiled = batch_model(core, MAX_BATCH_SIZE=8, BATCH_TIMEOUT_MS=50)

    def no_request() -> SyncInferRequest:
        raise AssertionError("the direct path must not create an infer request")

    monkeypatch.setattr(compiled, "create_sync_infer_request", no_request)
    feeds = exact_feeds(24)  # 1-3 rows each, 48 rows
    with anyio.fail_after(60):
        batched = await gather(compiled.infer, feeds)
    alone = exact_plain.create_infer_request()
    for feed, results in zip(feeds, batched):
        assert isinstance(results, ai.InferResults)
        assert_exact(results, alone.infer_sync(feed))
    # The unbatched runs agree with onnx.reference: int64 exactly, tanh to 1e-6.
    y, t = ReferenceEvaluator(exact_model()).run(None, feeds[0])
    np.testing.assert_array_equal(batched[0]["y"], y)
    np.testing.assert_allclose(batched[0]["t"], t, rtol=1e-6, atol=1e-6)
    statistics = compiled.batch_statistics()
    assert sum(rows * count for rows, count in statistics.items()) == 48
    assert sum(statistics.values()) < 24 and max(statistics) <= 8


async def test_direct_float_results_agree_with_onnxruntime(core):
    model = mlp_model(in_features=64, out_features=32, seed=3)
    compiled = core.compile_model(model, "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(12)]
    with anyio.fail_after(60):
        batched = await gather(compiled.infer, feeds)
    for feed, results in zip(feeds, batched):
        for got, want in zip(results.to_tuple(), reference_outputs(model, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert sum(compiled.batch_statistics().values()) < 12


async def test_infer_timed_reports_the_seconds_queued(core, exact_plain):
    timeout = 0.06
    compiled = batch_model(core, MAX_BATCH_SIZE=8, BATCH_TIMEOUT_MS=timeout * 1000)
    feed = single_rows(1)[0]
    start = time.perf_counter()
    with anyio.fail_after(60):
        results, queued = await compiled.infer_timed(feed)
    elapsed = time.perf_counter() - start
    assert_exact(results, exact_plain.create_infer_request().infer_sync(feed))
    # Alone in the queue, the rows waited out the whole timeout (same clock as the batcher),
    # and the wait is part of the call.
    assert timeout <= queued <= elapsed
    # A full batch does not wait for the timeout (60 s: the guard fails first).
    full = batch_model(core, MAX_BATCH_SIZE=2, BATCH_TIMEOUT_MS=60_000)
    start = time.perf_counter()
    with anyio.fail_after(30):
        outcomes = await gather(full.infer_timed, single_rows(2))
    elapsed = time.perf_counter() - start
    assert all(0 <= seconds <= elapsed for _, seconds in outcomes)
    assert full.batch_statistics() == {2: 1}


# -- isolation ------------------------------------------------------------------------------


async def test_a_bad_input_fails_only_its_own_call(core, exact_plain):
    compiled = batch_model(core, BATCH_TIMEOUT_MS=50)
    feeds = exact_feeds(8)
    bad = {
        1: (dict(feeds[1], xi=feeds[1]["xi"].astype(np.float64)), ai.InputTypeError, "'xi'"),
        2: (dict(feeds[2], xf=np.zeros((1, 5), np.float32)), ai.InputShapeError, "'xf'"),
        3: (dict(feeds[3], xf=np.zeros((9, 4), np.float32)), ai.InputShapeError, "'batch'"),
        4: (dict(feeds[4], colour=feeds[4]["xf"]), ai.UnknownInputError, "'colour'"),
        5: ({"xi": feeds[5]["xi"]}, ai.MissingInputError, "'xf'"),
    }
    given = [bad[i][0] if i in bad else feed for i, feed in enumerate(feeds)]
    with anyio.fail_after(60):
        outcomes = await gather(compiled.infer, given)
    for index, (_, error, word) in bad.items():
        assert type(outcomes[index]) is error, (index, outcomes[index])
        assert word in str(outcomes[index])
    alone = exact_plain.create_infer_request()
    good = [0, 6, 7]
    for index in good:
        assert_exact(outcomes[index], alone.infer_sync(feeds[index]))
    # Bad inputs are refused before the queue: only the good rows were batched.
    rows = sum(rows * n for rows, n in compiled.batch_statistics().items())
    assert rows == sum(feeds[i]["xi"].shape[0] for i in good)
    # And the compiled model goes on serving, the failed inputs too once fixed.
    with anyio.fail_after(60):
        assert_exact(await compiled.infer(feeds[5]), alone.infer_sync(feeds[5]))


async def test_a_kernel_failure_fails_only_the_call_that_caused_it(core):
    compiled = core.compile_model(gather_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    assert isinstance(compiled, BatchCompiledModel)
    indices = [{"index": np.array([i % 10], np.int64)} for i in range(6)]
    indices[3] = {"index": np.array([99], np.int64)}  # out of range: fails in the kernel
    with anyio.fail_after(60):
        outcomes = await gather(compiled.infer_timed, indices)
    assert isinstance(outcomes[3], ai.InferenceError) and "gather" in str(outcomes[3])
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    for index in (0, 1, 2, 4, 5):
        results, queued = outcomes[index]
        np.testing.assert_array_equal(results["rows"], table[indices[index]["index"]])
        assert queued >= 0
    assert compiled.batch_statistics() == {6: 1}  # one batch, then each ran alone


# -- cancellation and close -----------------------------------------------------------------


async def test_cancelling_a_waiting_direct_call_withdraws_its_rows(core, exact_plain):
    compiled = batch_model(core, MAX_BATCH_SIZE=4, BATCH_TIMEOUT_MS=60_000)
    feeds = single_rows(5)
    scopes = [anyio.CancelScope() for _ in feeds]
    results: dict[int, ai.InferResults] = {}

    async def one(index: int) -> None:
        with scopes[index]:
            results[index] = await compiled.infer(feeds[index])

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for index in range(3):
                group.start_soon(one, index)
            await anyio.wait_all_tasks_blocked()
            scopes[1].cancel()  # 3 rows queued of a batch of 4: call 1 leaves
            await anyio.wait_all_tasks_blocked()
            group.start_soon(one, 3)  # 3 rows again: still not full
            await anyio.wait_all_tasks_blocked()
            assert compiled.batch_statistics() == {}
            group.start_soon(one, 4)  # 4 rows: the batch runs, without call 1
    assert scopes[1].cancelled_caught
    assert sorted(results) == [0, 2, 3, 4]
    assert compiled.batch_statistics() == {4: 1}
    alone = exact_plain.create_infer_request()
    for index in results:
        assert_exact(results[index], alone.infer_sync(feeds[index]))


async def test_cancelling_every_direct_call_of_a_running_batch_stops_its_compute(core):
    compiled = core.compile_model(
        chain_model(300, WIDE, seed=1), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 0, "NUM_STREAMS": 1}
    )
    rows = 128
    while True:  # a full run long enough that load cannot decide the comparison below
        x = np.random.default_rng(7).standard_normal((rows, WIDE)).astype(np.float32)
        # The first run of a shape records its memory plan (under load it can take longer
        # than the full run): the small call below must not be the first of its shape.
        await compiled.infer({"x": x[:1]})
        start = time.perf_counter()
        await compiled.infer({"x": x})
        full = time.perf_counter() - start
        if full > 0.3 or rows >= 2048:
            break
        rows *= 2
    with anyio.move_on_after(full / 10) as scope:
        await gather(compiled.infer, [{"x": x[: rows // 2]}, {"x": x[rows // 2 :]}])
    assert scope.cancelled_caught
    # One target request: a small call runs as soon as the cancelled batch let go of it.
    start = time.perf_counter()
    await compiled.infer({"x": x[:1]})
    assert time.perf_counter() - start < full / 2, full


async def test_close_fails_in_flight_direct_calls_then_refuses_new_ones(core):
    compiled = batch_model(core, MAX_BATCH_SIZE=8, BATCH_TIMEOUT_MS=60_000)
    feeds = single_rows(3)
    outcomes: dict[int, Any] = {}

    async def one(index: int) -> None:
        try:
            outcomes[index] = await compiled.infer(feeds[index])
        except ai.AioinferError as exc:
            outcomes[index] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for index in range(3):
                group.start_soon(one, index)
            await anyio.wait_all_tasks_blocked()  # queued, waiting for a fuller batch
            await compiled.close()
    assert all(isinstance(outcomes[i], ai.InferCancelledError) for i in range(3)), outcomes
    assert compiled.batch_statistics() == {}
    with pytest.raises(ai.RequestClosedError, match="this compiled model is closed"):
        await compiled.infer(feeds[0])
    with pytest.raises(ai.RequestClosedError, match="this compiled model is closed"):
        await compiled.infer_timed(feeds[0])


# -- SyncInferRequest.validated -------------------------------------------------------------


def test_validated_checks_like_an_inference_and_keeps_nothing(core):
    compiled = core.compile_model(two_input_model(), "CPU")
    request = compiled.create_sync_infer_request()
    a = np.ones((2, 3), np.float32)
    b = np.full((2, 3), 2, np.float32)
    ref = weakref.ref(a)
    # Returned in input order; a list is converted to the port's element type.
    got = request.validated({"scale": [1, 2, 3], "b": b, "a": a}, share_inputs=True)
    assert got[0] is a and got[1] is b
    assert got[2].dtype == np.int64 and got[2].tolist() == [1, 2, 3]
    # By default they are fresh copies (a BATCH queue keeps them while the caller goes on).
    copies = request.validated({"scale": [1, 2, 3], "b": b, "a": a})
    assert not any(np.shares_memory(x, y) for x, y in zip(copies, got))
    np.testing.assert_array_equal(copies[0], a)
    # The request did not keep them: an inference without inputs finds none.
    with pytest.raises(ai.MissingInputError, match="'a', 'b', 'scale'"):
        request.infer({})
    del got, a
    gc.collect()
    assert ref() is None
    # Errors as an inference raises them, and nothing is kept after one either.
    with pytest.raises(ai.MissingInputError, match="'scale'"):
        request.validated({"a": b, "b": b})
    with pytest.raises(ai.InputShapeError, match="'N'"):
        request.validated({"a": b, "b": b[:1], "scale": [1, 2, 3]})
    with pytest.raises(ai.InputTypeError, match="'b'"):
        request.validated([b, b.astype(np.float64), [1, 2, 3]])
    with pytest.raises(ai.UnknownInputError, match="'c'"):
        request.validated({"c": b})
    with pytest.raises(ai.MissingInputError, match="'a'"):
        request.get_tensor("a")
    results = request.infer({"a": b, "b": b, "scale": [1, 2, 3]})
    np.testing.assert_array_equal(results["out"], np.tile([4.0, 8.0, 12.0], (2, 1)))
    # An inference keeps its inputs for the next one, until clear_inputs().
    again = request.infer({"a": b / 2})
    np.testing.assert_array_equal(again["out"], results["out"] * 0.75)
    request.clear_inputs()
    with pytest.raises(ai.MissingInputError, match="'a', 'b', 'scale'"):
        request.infer({})


async def test_an_async_request_forgets_its_inputs_when_idle(exact_plain):
    request = exact_plain.create_infer_request()
    feed = exact_feeds(1)[0]
    first = await request.infer(feed)
    np.testing.assert_array_equal((await request.infer({}))["y"], first["y"])  # kept
    request.clear_inputs()
    with pytest.raises(ai.MissingInputError, match="'xi', 'xf'"):
        await request.infer({})
    request.start_async(feed)
    with pytest.raises(ai.RequestBusyError):
        request.clear_inputs()  # a running inference keeps its inputs
    await request.wait()
    np.testing.assert_array_equal(request.get_tensor("y"), first["y"])


# -- queued_seconds -------------------------------------------------------------------------


async def test_queued_seconds_is_the_wait_for_the_batch_and_0_elsewhere(core, exact_plain):
    timeout = 0.06
    compiled = batch_model(core, MAX_BATCH_SIZE=8, BATCH_TIMEOUT_MS=timeout * 1000)
    request = compiled.create_infer_request()
    other = compiled.create_infer_request()  # it could join: the batch waits for it
    assert request.queued_seconds == 0.0  # before any inference
    feed = single_rows(1)[0]
    start = time.perf_counter()
    with anyio.fail_after(60):
        await request.infer(feed)
    assert timeout <= request.queued_seconds <= time.perf_counter() - start
    batch = next(e for e in request.get_profiling_info() if e["name"] == "batch")
    assert batch["seconds"] == request.queued_seconds
    # infer_sync runs alone on the target: no queue.
    request.infer_sync(feed)
    assert request.queued_seconds == 0.0
    await other.close()
    # The CPU computes at once when a task thread is free.
    plain = exact_plain.create_infer_request()
    start = time.perf_counter()
    await plain.infer(feed)
    assert 0 <= plain.queued_seconds <= time.perf_counter() - start


async def test_queued_seconds_includes_the_wait_for_a_task_thread(core):
    compiled = core.compile_model(chain_model(150, WIDE), "CPU", {"NUM_STREAMS": 1})
    x = np.random.default_rng(3).standard_normal((256, WIDE)).astype(np.float32)
    first, second = compiled.create_infer_request(), compiled.create_infer_request()
    await first.infer({"x": x})  # the first run of a shape records the memory plan
    took: list[float] = []

    async def timed_first() -> None:
        start = time.perf_counter()
        await first.infer({"x": x})
        took.append(time.perf_counter() - start)

    async with anyio.create_task_group() as group:
        group.start_soon(timed_first)
        await anyio.wait_all_tasks_blocked()
        group.start_soon(second.infer, {"x": x})
    # One task thread: a free thread took the first inference at once, and the second one
    # waited for the first one's compute, most of the first call.
    assert first.queued_seconds < took[0] / 2, (took, first.queued_seconds)
    assert second.queued_seconds > took[0] / 2, (took, second.queued_seconds)
    start = time.perf_counter()
    await second.infer({"x": x[:1]})  # alone again: no wait is carried over
    assert second.queued_seconds <= time.perf_counter() - start


# -- CompiledModel.infer on the CPU: pooled requests ----------------------------------------


async def test_compiled_infer_reuses_its_requests(core, exact_plain, monkeypatch):
    compiled = core.compile_model(exact_model(), "CPU")
    created = count_created(compiled, monkeypatch)
    feeds = exact_feeds(6)
    alone = exact_plain.create_infer_request()
    for feed in feeds:
        assert_exact(await compiled.infer(feed), alone.infer_sync(feed))
    assert created[0] == 1  # one after the other: one request, reused


async def test_concurrent_compiled_infer_calls_run_on_separate_requests(core, monkeypatch):
    model = chain_model(20, 64, seed=2)
    compiled = core.compile_model(model, "CPU")
    created = count_created(compiled, monkeypatch)
    rng = np.random.default_rng(9)
    feeds = [{"x": rng.standard_normal((1 + i, 64)).astype(np.float32)} for i in range(8)]
    for _ in range(2):
        with anyio.fail_after(60):
            outcomes = await gather(compiled.infer, feeds)
        for feed, results in zip(feeds, outcomes):
            (expected,) = reference_outputs(model, feed)
            np.testing.assert_allclose(results["y"], expected, rtol=1e-5, atol=1e-5)
    # Eight at once need eight requests; the second round reuses them.
    assert created[0] == 8


async def test_compiled_infer_does_not_lend_one_callers_inputs_to_the_next(core):
    compiled = core.compile_model(two_input_model(), "CPU")
    a = np.ones((1, 3), np.float32)
    results = await compiled.infer({"a": a, "b": a, "scale": np.array([1, 2, 3])})
    np.testing.assert_array_equal(results["out"], [[2.0, 4.0, 6.0]])
    # The pooled request ran with a scale: a call without one must still be refused.
    with pytest.raises(ai.MissingInputError, match="'scale'"):
        await compiled.infer({"a": a, "b": a})
    with pytest.raises(ai.InputShapeError, match="'b'"):
        await compiled.infer({"a": a, "b": np.ones((1, 4), np.float32), "scale": [1, 1, 1]})
    results = await compiled.infer({"a": a, "b": 2 * a, "scale": np.array([1, 0, -1])})
    np.testing.assert_array_equal(results["out"], [[3.0, 0.0, -3.0]])


async def test_cancelling_compiled_infer_stops_it_and_frees_its_request(core, monkeypatch):
    model = chain_model(300, WIDE, seed=1)
    compiled = core.compile_model(model, "CPU", {"NUM_STREAMS": 1})
    created = count_created(compiled, monkeypatch)
    x = np.random.default_rng(10).standard_normal((128, WIDE)).astype(np.float32)
    start = time.perf_counter()
    await compiled.infer({"x": x})
    full = time.perf_counter() - start
    start = time.perf_counter()
    with anyio.move_on_after(full / 10) as scope:
        await compiled.infer({"x": x})
    assert scope.cancelled_caught
    assert time.perf_counter() - start < full / 2, full
    small = {"x": x[:2]}
    (expected,) = reference_outputs(model, small)
    np.testing.assert_allclose((await compiled.infer(small))["y"], expected, rtol=1e-4, atol=1e-5)
    assert created[0] == 1  # the cancelled inference gave its request back, idle


@pytest.mark.parametrize(
    ("device", "config"),
    [("CPU", {"NUM_STREAMS": 1}), ("BATCH:CPU", {"BATCH_TIMEOUT_MS": 0, "NUM_STREAMS": 1})],
)
async def test_close_stops_a_running_compiled_infer_then_refuses_new_ones(core, device, config):
    """On CPU the call runs on a pooled request; on BATCH its rows are a running batch."""
    compiled = core.compile_model(chain_model(300, WIDE, seed=1), device, config)
    x = np.random.default_rng(11).standard_normal((128, WIDE)).astype(np.float32)
    start = time.perf_counter()
    await compiled.infer({"x": x})  # CPU: leaves an idle request in the pool
    full = time.perf_counter() - start
    outcomes: list[Any] = []

    async def one() -> None:
        try:
            outcomes.append(await compiled.infer({"x": x}))
        except ai.AioinferError as exc:
            outcomes.append(exc)

    with anyio.fail_after(full * 5 + 60):
        async with anyio.create_task_group() as group:
            group.start_soon(one)
            await anyio.sleep(full / 10)  # computing
            start = time.perf_counter()
            await compiled.close()
        closed = time.perf_counter() - start
    assert len(outcomes) == 1 and isinstance(outcomes[0], ai.InferCancelledError), outcomes
    assert closed < full / 2, (closed, full)
    with pytest.raises(ai.RequestClosedError, match="this compiled model is closed"):
        await compiled.infer({"x": x})


# -- the batcher answers a batch after starting the next one ---------------------------------


async def test_the_next_batch_starts_before_the_last_one_is_answered(
    core, exact_plain, monkeypatch
):
    # One target request: the second batch can start only once the first one let go of it.
    compiled = batch_model(core, MAX_BATCH_SIZE=2, BATCH_TIMEOUT_MS=60_000, NUM_STREAMS=1)
    log: list[str] = []
    take = compiled.batcher._take

    def logged_take(request: ai.InferRequest) -> Any:
        log.append("batch")
        return take(request)

    monkeypatch.setattr(compiled.batcher, "_take", logged_take)
    feeds = single_rows(4)
    results: dict[int, ai.InferResults] = {}

    async def one(index: int) -> None:
        results[index] = await compiled.infer(feeds[index])
        log.append("answer")

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for index in range(4):
                group.start_soon(one, index)
    assert compiled.batch_statistics() == {2: 2}
    # The second batch was formed before any inference of the first one had its answer.
    assert log == ["batch", "batch", "answer", "answer", "answer", "answer"], log
    alone = exact_plain.create_infer_request()
    for index, feed in enumerate(feeds):
        assert_exact(results[index], alone.infer_sync(feed))


async def test_compiled_model_infer_starts_a_stateful_model_from_its_initial_state() -> None:
    """State lives in the requests a caller keeps: every pooled ``infer`` call sees the
    initial (zero) state, whichever pooled request it runs on, while a kept request
    accumulates."""
    from tests.test_stateful import counter_model

    compiled = ai.Core().compile_model(counter_model(), "CPU", {"STATEFUL": "auto"})
    x = np.array([1.0, 2.0], np.float32)
    feeds = {"x": x, "shape": np.array([1, 2], np.int64)}
    for _ in range(3):
        results = await compiled.infer(feeds)
        np.testing.assert_array_equal(results["y"], x.reshape(1, 2))
    kept = compiled.create_infer_request()
    await kept.infer(feeds)
    results = await kept.infer(feeds)
    np.testing.assert_array_equal(results["y"], 2 * x.reshape(1, 2))
    await compiled.close()


async def test_infer_timed_on_any_device_reports_its_queue_wait(core, exact_plain) -> None:
    """The server calls ``infer_timed`` on every compiled model: a pooled request on the
    CPU (a free task thread takes it at once, or the loop runs the short plan inline:
    well under the batch timeout), the batch queue on BATCH (the timeout)."""
    (feed,) = single_rows(1)
    want = exact_plain.create_infer_request().infer_sync(feed)
    start = time.perf_counter()
    results, queued = await exact_plain.infer_timed(feed)
    assert 0.0 <= queued <= time.perf_counter() - start
    np.testing.assert_array_equal(results[0], want[0])
    batched = batch_model(core, MAX_BATCH_SIZE=8, BATCH_TIMEOUT_MS=20)
    start = time.perf_counter()
    results, queued = await batched.infer_timed(feed)
    assert 0.02 <= queued <= time.perf_counter() - start
    np.testing.assert_array_equal(results[0], want[0])
    await batched.close()
