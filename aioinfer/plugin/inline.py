"""Short runs inline: a device's compute stage that is known to be short runs on the
event loop's own thread instead of hopping to a compute thread.

The hop to a compute thread and back costs two thread wake-ups: tens of microseconds on
a quiet machine, over a hundred on a loaded one, as much as a small model's whole run.
A device measures each run (:meth:`RunTimes.record`, with the clock it trusts) and runs
its compute stage through a :class:`RunExecutor`: a run whose input shapes last ran for
less than the budget runs inline; the first run of new shapes, a long one, and (for an
``exclusive`` device) any run while another of the same compiled model is on a thread,
go to the device's task executor.

Inline runs hold the loop, so they yield to it on a time budget rather than per run: a
task that infers in a loop lets the other tasks run at least every ``budget`` seconds
(plus one run), and before each inline run a cancellation already requested (an anyio
or trio cancel scope) is delivered. A yield is a loop iteration; yielding around every
run of a small model cost about a third of aioinfer's own time per inference (profiled).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.lowlevel

from aioinfer.plugin.executors import Executor, asyncio_loop

T = TypeVar("T")

MAX_SHAPES = 64
"""Input shapes whose run time is remembered (beyond: forgotten, measured again)."""


class RunTimes:
    """A compiled model's run times per input shapes, which decide where a run goes.

    ``weight`` is the weight of the latest run in the running average kept per shapes
    (1: the last run alone; less, and one run slowed by the machine's load does not send
    the next ones to a thread). A run counts for at most twice the budget: a run that
    lost a time slice on a loaded machine (milliseconds) then moves the average of a
    short model by a fraction of the budget instead of keeping its next runs on a thread
    until the average decays, while a model whose runs are long stays above the budget
    from its first run. ``exclusive``: a run goes inline only while no run of the
    compiled model is in flight on a thread (for an engine whose one stream computes one
    run at a time: an inline run next to a threaded one would be a second stream).
    """

    def __init__(
        self,
        budget_seconds: float,
        *,
        weight: float = 1.0,
        exclusive: bool = False,
        rise_weight: float | None = None,
    ):
        self.budget = budget_seconds
        self.weight = weight
        self.rise_weight = rise_weight
        """With a value, a run slower than the average moves it by this weight and counts
        for at most twice the average: the average follows the typical run and rises only
        gradually (a few percent a run), so that runs the machine's load stretched do not
        swing a comparison of two averages (:mod:`aioinfer.devices.ort.single`)."""
        self.exclusive = exclusive
        self.seconds: dict[Any, float] = {}
        self.in_flight = 0
        """Runs on the task executor now (changed on the event loop only)."""

    def record(self, shapes: Any, seconds: float) -> None:
        """Note how long a run on inputs of ``shapes`` took (any thread)."""
        if self.budget:
            seconds = min(seconds, 2 * self.budget)
        average = self.seconds.get(shapes)
        if average is None:
            if len(self.seconds) >= MAX_SHAPES:
                self.seconds.clear()
            self.seconds[shapes] = seconds
        elif seconds > average and self.rise_weight is not None:
            rise = min(seconds, 2 * average) - average
            self.seconds[shapes] = average + self.rise_weight * rise
        else:
            self.seconds[shapes] = average + self.weight * (seconds - average)

    def short(self, shapes: Any) -> bool:
        """Whether a run on ``shapes`` may run inline now."""
        if self.exclusive and self.in_flight:
            return False
        return self.seconds.get(shapes, self.budget) < self.budget


class _LoopTurn(threading.local):
    """When the event loop of this thread last had a turn, as far as inline runs know."""

    at = 0.0


_turn = _LoopTurn()


def before_inline_run(budget: float) -> Awaitable[None] | None:
    """What a run inline on the loop's thread awaits before it starts: a yield to the
    loop when the loop last had a turn ``budget`` or more seconds ago, else the delivery
    of a cancellation already requested (see the module); None when there is nothing to
    await (under asyncio, no cancel scope of the task has been cancelled)."""
    if time.perf_counter() - _turn.at >= budget:
        return _yield_to_loop()
    if asyncio_loop() is None:
        return anyio.lowlevel.checkpoint_if_cancelled()
    if not _asyncio_scope_cancelled():
        return None
    return _asyncio_cancel_check()()


def _scope_cancelled_by_anyio_state() -> Callable[[], bool] | None:
    """A test of whether a cancel scope around the current asyncio task has been
    cancelled (up to the first shield), reading the task states of anyio's asyncio
    backend as its ``checkpoint_if_cancelled`` does, without making a coroutine and
    without the weak dictionary's Python-level lookup: after an engine's run evicted the
    caches, that check cost about 5 us of the ~48 us of an awaited inline run of a 23 us
    model (profiled). None when anyio's internals are not as expected: the check then
    goes through anyio."""
    try:
        from anyio._backends._asyncio import _task_states
    except ImportError:  # pragma: no cover - another anyio
        return None
    states = getattr(_task_states, "data", None)
    if not isinstance(states, dict):  # pragma: no cover - another anyio
        return None
    current_task = asyncio.current_task
    reference = weakref.ref

    def cancelled() -> bool:
        task = current_task()
        state = None if task is None else states.get(reference(task))
        scope = None if state is None else state.cancel_scope
        while scope is not None:
            if scope.cancel_called:
                return True
            if scope.shield:
                return False
            scope = scope._parent_scope
        return False

    return cancelled


def _asyncio_scope_cancelled() -> bool:
    """Whether an inline run must go through anyio's cancel check first (see
    :func:`_scope_cancelled_by_anyio_state`; True when that test is unavailable)."""
    try:
        return _SCOPE_CANCELLED() if _SCOPE_CANCELLED is not None else True
    except AttributeError:  # pragma: no cover - anyio's state took another shape
        return True


_SCOPE_CANCELLED = _scope_cancelled_by_anyio_state()


async def _yield_to_loop() -> None:
    if asyncio_loop() is not None:
        await asyncio.sleep(0)  # anyio's checkpoint finds the backend first
    else:
        await anyio.lowlevel.checkpoint()
    _turn.at = time.perf_counter()


@functools.cache
def _asyncio_cancel_check() -> Callable[[], Awaitable[None]]:
    """anyio's cancel check of its asyncio backend, found once: ``checkpoint_if_cancelled``
    finds the backend of the running loop on every call, which cost more than half of the
    check (about 2 of 3.5 us, profiled)."""
    return anyio.lowlevel.current_token().backend_class.checkpoint_if_cancelled


class RunExecutor(Executor):
    """The executor of one request's compute stage: inline when :class:`RunTimes` says
    the run is short, else ``threads`` (the device's task executor)."""

    name = "run"

    def __init__(self, threads: Executor, times: RunTimes, shapes: Callable[[], Any]) -> None:
        self._threads = threads
        self._times = times
        self._shapes = shapes

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        return (await self.run_timed(stage, on_cancel))[0]

    async def run_timed(
        self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None
    ) -> tuple[T, float]:
        times = self._times
        if times.short(self._shapes()):
            checkpoint = before_inline_run(times.budget)
            if checkpoint is not None:
                await checkpoint  # nothing interrupts the run once started
            return stage(), 0.0
        times.in_flight += 1
        try:
            return await self._threads.run_timed(stage, on_cancel)
        finally:
            times.in_flight -= 1
            _turn.at = time.perf_counter()  # the loop ran other work meanwhile
