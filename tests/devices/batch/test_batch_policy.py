"""When the BATCH device starts a batch that is not full: at once when nobody else can
join it, and without waiting when no further arrival is expected before the timeout.

The timeouts here are long (a minute) where the batch must not wait for them, so that a
batch that did wait fails the test's guard, which is half the timeout; where a wait is
expected, it is measured in the same test as the control.
"""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import aioinfer as ai
from tests.helpers import mlp_model, reference_outputs

pytestmark = pytest.mark.anyio

MINUTE_MS = 60_000


def rows(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(count)]


def assert_results(results: ai.InferResults, feed: dict[str, np.ndarray]) -> None:
    for got, want in zip(results.to_tuple(), reference_outputs(mlp_model(), feed), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


async def test_a_lone_request_does_not_wait_out_the_timeout(core):
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": MINUTE_MS}
    )
    request = compiled.create_infer_request()
    (feed,) = rows(1)
    with anyio.fail_after(30):  # half the timeout
        results = await request.infer(feed)
    assert_results(results, feed)
    assert compiled.batch_statistics() == {1: 1}
    await compiled.close()


async def test_a_queue_runs_a_batch_as_soon_as_all_its_requests_are_in(core):
    """Four requests of an AsyncInferQueue, a batch of up to 8 rows: no fifth request can
    join, so each batch of four starts at once instead of after the minute."""
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": MINUTE_MS}
    )
    feeds = rows(12, seed=1)
    results: dict[int, ai.InferResults] = {}

    def done(request: ai.InferRequest, index: int) -> None:
        results[index] = request.results

    with anyio.fail_after(30):
        async with ai.AsyncInferQueue(compiled, 4) as queue:
            queue.set_callback(done)
            for index, feed in enumerate(feeds):
                await queue.start_async(feed, index)
            await queue.wait_all()
    assert sorted(results) == list(range(12))
    for index, feed in enumerate(feeds):
        assert_results(results[index], feed)
    assert compiled.batch_statistics() == {4: 3}
    await compiled.close()


async def test_a_direct_call_after_a_quiet_spell_does_not_wait(core):
    """The first call of a new model waits the whole timeout (the control); after a
    quiet spell of four timeouts, a lone call starts its batch at once."""
    timeout = 0.4
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": timeout * 1000}
    )
    first, second = rows(2, seed=2)
    with anyio.fail_after(30):
        results, waited = await compiled.infer_timed(first)
        assert_results(results, first)
        assert waited >= timeout
        quiet = time.perf_counter()
        while time.perf_counter() - quiet < 4 * timeout:  # the batcher's clock
            await anyio.sleep(timeout)
        results, queued = await compiled.infer_timed(second)
    assert_results(results, second)
    assert queued < waited / 2
    assert compiled.batch_statistics() == {1: 2}
    await compiled.close()


async def test_a_direct_call_in_the_queue_keeps_the_batch_open(core):
    """Direct calls come from an open population: while one is queued, a batch waits
    for more even if every request is in (here the burst fills it)."""
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 3, "BATCH_TIMEOUT_MS": MINUTE_MS}
    )
    request = compiled.create_infer_request()
    feeds = rows(3, seed=3)
    results: dict[int, ai.InferResults] = {}

    async def direct(index: int) -> None:
        results[index] = await compiled.infer(feeds[index])

    async def member() -> None:
        results[2] = await request.infer(feeds[2])

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(direct, 0)
            await anyio.wait_all_tasks_blocked()
            group.start_soon(member)
            await anyio.wait_all_tasks_blocked()
            assert compiled.batch_statistics() == {}  # the request is in, the call too
            group.start_soon(direct, 1)  # three rows: the batch is full
    for index, feed in enumerate(feeds):
        assert_results(results[index], feed)
    assert compiled.batch_statistics() == {3: 1}
    await compiled.close()


async def test_the_optimal_number_of_requests_fills_batches(core):
    """``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` of a BATCH model provides rows for every batch
    that keeps the target busy: the target's optimal number times 16 (or the
    ``MAX_BATCH_SIZE`` if smaller)."""
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2}
    plain = core.compile_model(mlp_model(), "CPU", {**config, "ALLOW_AUTO_BATCHING": "NO"})
    target = plain.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    batched = core.compile_model(mlp_model(), "BATCH:CPU", config)
    assert batched.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == target * 16
    small = core.compile_model(mlp_model(), "BATCH:CPU", {**config, "MAX_BATCH_SIZE": 3})
    assert small.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == target * 3
    assert len(ai.AsyncInferQueue(batched)) == target * 16
    for compiled in (plain, batched, small):
        await compiled.close()


async def test_a_queue_cycles_in_as_many_batches_as_keep_the_target_busy(core):
    """Twice as many requests as the batches that keep the target busy: each batch
    takes two of them (not everyone at once), without waiting for the minute."""
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "BATCH_TIMEOUT_MS": MINUTE_MS}
    compiled = core.compile_model(mlp_model(), "BATCH:CPU", config)
    depth = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") // 16
    feeds = rows(6 * depth, seed=4)
    results: dict[int, ai.InferResults] = {}

    def done(request: ai.InferRequest, index: int) -> None:
        results[index] = request.results

    with anyio.fail_after(30):
        async with ai.AsyncInferQueue(compiled, 2 * depth) as queue:
            queue.set_callback(done)
            for index, feed in enumerate(feeds):
                await queue.start_async(feed, index)
            await queue.wait_all()
    for index, feed in enumerate(feeds):
        assert_results(results[index], feed)
    assert compiled.batch_statistics() == {2: 3 * depth}
    await compiled.close()


async def test_a_closed_request_is_not_waited_for(core):
    """Requests of a closed queue, still referenced, no longer count: the next queue's
    batches start as soon as its own requests are in."""
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": MINUTE_MS}
    )
    feeds = rows(8, seed=5)
    queues = []
    with anyio.fail_after(30):
        for _ in range(2):
            async with ai.AsyncInferQueue(compiled, 4) as queue:
                for feed in feeds:
                    await queue.start_async(feed)
                await queue.wait_all()
            queues.append(queue)  # its requests stay alive, closed
        alone = compiled.create_infer_request()
        assert_results(await alone.infer(feeds[0]), feeds[0])
    assert compiled.batch_statistics() == {4: 4, 1: 1}
    await compiled.close()


async def test_a_lone_caller_sending_one_after_the_other_does_not_wait(core):
    """A lone direct caller in a closed loop: the first call of a new model waits the
    whole timeout (the control); every later call is the return the batcher expects
    after answering it, nobody else is expected, so its batch starts at once."""
    timeout = 0.4
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": timeout * 1000}
    )
    feeds = rows(6, seed=6)
    with anyio.fail_after(30):
        results, waited = await compiled.infer_timed(feeds[0])
        assert_results(results, feeds[0])
        assert waited >= timeout
        for feed in feeds[1:]:
            results, queued = await compiled.infer_timed(feed)
            assert_results(results, feed)
            assert queued < waited / 2
    assert compiled.batch_statistics() == {1: 6}
    await compiled.close()


async def test_the_callers_of_a_batch_are_waited_for_when_they_come_back(core):
    """Eight direct callers in a closed loop, as behind a server: six timeouts after a
    batch is answered (a server writes every answer before it reads the next requests),
    the first caller comes back and finds the device idle after a gap of more than four
    timeouts since the last arrival; the seven others come a few loop iterations later,
    once the batcher has decided what to do with it. Its batch waits for them, the
    returns the batcher expects, instead of running one row that they would then wait
    for."""
    timeout = 0.1
    compiled = core.compile_model(
        mlp_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": timeout * 1000}
    )
    feeds = rows(8, seed=7)
    rounds = 4

    async def call(index: int) -> None:
        assert_results(await compiled.infer(feeds[index]), feeds[index])

    with anyio.fail_after(30):
        for _ in range(rounds):
            async with anyio.create_task_group() as group:
                group.start_soon(call, 0)
                for _ in range(50):  # loop iterations: its batch waits, or runs
                    await anyio.lowlevel.checkpoint()
                for index in range(1, 8):
                    group.start_soon(call, index)
            await anyio.sleep(6 * timeout)
    assert compiled.batch_statistics() == {8: rounds}
    await compiled.close()
