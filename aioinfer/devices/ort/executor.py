"""Where an ORT request's run goes: a compute thread, or, when it is known to be short
and the one stream is idle, the event loop's own thread.

The hop to a compute thread and back costs tens of microseconds (two thread wake-ups);
onnxruntime runs small models in less. With one stream (the LATENCY hint) runs of a
compiled model happen one at a time anyway, so a run expected to take less than
``ORT_INLINE_RUN_US`` (its last run with the same input shapes did) runs inline while
no other run is in flight: the loop is held for at most about that long, no
parallelism is lost, and the stream limit still holds. Anything else, and the first run
of new input shapes, goes to the task executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import anyio.lowlevel

from aioinfer.plugin.executors import Executor, asyncio_loop

T = TypeVar("T")

MAX_SHAPES = 64
"""Input shapes whose last run time is remembered (beyond: forgotten, measured again)."""


class RunTimes:
    """The last run time of a compiled model per input shapes, and its runs in flight on
    its task executor (changed on the event loop only)."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget = budget_seconds
        self.seconds: dict[tuple[object, ...], float] = {}
        self.in_flight = 0

    def record(self, shapes: tuple[object, ...], seconds: float) -> None:
        """Note how long a run on inputs of ``shapes`` took (any thread)."""
        if len(self.seconds) >= MAX_SHAPES and shapes not in self.seconds:
            self.seconds.clear()
        self.seconds[shapes] = seconds

    def short(self, shapes: tuple[object, ...]) -> bool:
        """Whether a run on ``shapes`` may run inline now."""
        return self.in_flight == 0 and self.seconds.get(shapes, self.budget) < self.budget


async def checkpoint() -> None:
    """A yield to the event loop where a pending cancellation is delivered: asyncio's own
    ``sleep(0)`` under asyncio (anyio's checkpoint first finds the backend, which costs
    more than the yield), anyio's elsewhere."""
    if asyncio_loop() is not None:
        await asyncio.sleep(0)
    else:
        await anyio.lowlevel.checkpoint()


class RunExecutor(Executor):
    """The executor of one request's run stage: inline when :class:`RunTimes` says it is
    short, else ``threads`` (the task executor)."""

    name = "ort-run"

    def __init__(self, threads: Executor, times: RunTimes, shapes: Callable[[], tuple]) -> None:
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
            # One yield to the loop per inline run: a cancel already asked for stops the
            # run before it starts (the run itself cannot be stopped once inline), and a
            # task that infers in a loop does not starve the others (it yields before
            # each run). A second yield after the run cost another loop iteration, a
            # third of aioinfer's own time per inline inference (profiled).
            await checkpoint()
            return stage(), 0.0
        times.in_flight += 1
        try:
            return await self._threads.run_timed(stage, on_cancel)
        finally:
            times.in_flight -= 1
