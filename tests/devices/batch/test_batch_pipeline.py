"""The batcher's dispatch policy against a target that queues work of its own.

A target whose ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` exceeds its streams (the PROCESS
device) is handed full batches while its streams are busy, so that the next batch starts
the moment a stream frees up; partial batches still wait for a free stream. The target
here is a stand-in whose inferences end when the test says so, so that every step of the
policy can be observed.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from aioinfer.devices.batch.batcher import Batcher, BatchItem, ItemState

pytestmark = pytest.mark.anyio


class _Results:
    def __init__(self, outputs: list[np.ndarray]) -> None:
        self.outputs = outputs

    def to_tuple(self) -> tuple[np.ndarray, ...]:
        return tuple(self.outputs)


class _Request:
    """Doubles its input; each inference ends when the test releases it."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.queued_seconds = 0.0

    async def infer(self, inputs: list[np.ndarray], share_inputs: bool = False) -> _Results:
        release = anyio.Event()
        self.target.running.append((inputs[0].shape[0], release))
        await release.wait()
        self.queued_seconds = self.target.waits.pop(0) if self.target.waits else 0.0
        return _Results([inputs[0] * 2])

    def cancel(self) -> None:
        raise AssertionError("no batch is cancelled here")


class _Target:
    """One stream; ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` is ``optimal``."""

    streams = 1

    def __init__(self, optimal: int) -> None:
        self.optimal = optimal
        self.running: list[tuple[int, anyio.Event]] = []
        self.waits: list[float] = []
        """``queued_seconds`` the next inferences report, in order."""

    def get_property(self, name: str) -> Any:
        assert name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS"
        return self.optimal

    def create_infer_request(self) -> _Request:
        return _Request(self)

    async def finish_first(self) -> None:
        _, release = self.running.pop(0)
        release.set()
        await anyio.wait_all_tasks_blocked()


def _submit(batcher: Batcher, *values: float) -> list[BatchItem]:
    return [batcher.submit([np.full((1, 2), v, np.float32)]) for v in values]


def _rows(target: _Target) -> list[int]:
    return [rows for rows, _ in target.running]


async def test_full_batches_wait_in_the_target_while_its_stream_is_busy():
    target = _Target(optimal=2)
    batcher = Batcher(target, max_batch_size=2, timeout=60.0)  # type: ignore[arg-type]
    assert batcher.depth == 2
    first = _submit(batcher, 1, 2)
    await anyio.wait_all_tasks_blocked()
    assert _rows(target) == [2]
    second = _submit(batcher, 3, 4)
    await anyio.wait_all_tasks_blocked()
    assert _rows(target) == [2, 2]  # handed over while the first still computes
    third = _submit(batcher, 5, 6)
    await anyio.wait_all_tasks_blocked()
    assert _rows(target) == [2, 2]  # two batches in the target at most
    assert all(item.state is ItemState.QUEUED for item in third)
    await target.finish_first()
    assert _rows(target) == [2, 2]  # the third went in as the first came out
    assert all(item.state is ItemState.RUNNING for item in third)
    for item, value in zip(first, (1, 2)):
        assert item.outputs is not None
        np.testing.assert_array_equal(item.outputs[0], np.full((1, 2), 2 * value))
    await target.finish_first()
    await target.finish_first()
    for item, value in zip(second + third, (3, 4, 5, 6)):
        assert item.outputs is not None
        np.testing.assert_array_equal(item.outputs[0], np.full((1, 2), 2 * value))


async def test_a_partial_batch_waits_for_a_free_stream_after_its_timeout():
    target = _Target(optimal=2)
    batcher = Batcher(target, max_batch_size=2, timeout=0.02)  # type: ignore[arg-type]
    _submit(batcher, 1, 2)
    await anyio.wait_all_tasks_blocked()
    (partial,) = _submit(batcher, 3)
    await anyio.sleep(0.1)  # well past its timeout
    assert _rows(target) == [2]
    assert partial.state is ItemState.QUEUED
    await target.finish_first()
    assert _rows(target) == [1]
    await target.finish_first()
    assert partial.outputs is not None
    np.testing.assert_array_equal(partial.outputs[0], np.full((1, 2), 6))


async def test_a_target_without_a_queue_of_its_own_gets_one_batch_per_stream():
    target = _Target(optimal=1)
    batcher = Batcher(target, max_batch_size=2, timeout=60.0)  # type: ignore[arg-type]
    assert batcher.depth == 1
    _submit(batcher, 1, 2)
    await anyio.wait_all_tasks_blocked()
    waiting = _submit(batcher, 3, 4)
    await anyio.wait_all_tasks_blocked()
    assert _rows(target) == [2]
    assert all(item.state is ItemState.QUEUED for item in waiting)
    await target.finish_first()
    assert _rows(target) == [2]
    await target.finish_first()


async def test_queue_time_includes_the_wait_in_the_target():
    target = _Target(optimal=2)
    # The second batch reports an hour of waiting for the stream: far more than any real
    # delay between the submission and the dispatch of the first one, however loaded.
    target.waits = [0.0, 3600.0]
    batcher = Batcher(target, max_batch_size=2, timeout=60.0)  # type: ignore[arg-type]
    first = _submit(batcher, 1, 2)
    await anyio.wait_all_tasks_blocked()
    second = _submit(batcher, 3, 4)
    await anyio.wait_all_tasks_blocked()
    await target.finish_first()
    await target.finish_first()
    assert all(item.dispatched - item.enqueued < 3600 for item in first)
    assert all(item.dispatched - item.enqueued >= 3600 for item in second)
