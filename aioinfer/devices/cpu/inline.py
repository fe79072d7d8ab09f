"""Where a CPU request's plan runs: a compute thread, or, when it is known to be short,
the event loop's own thread.

The hop to a compute thread and back (two thread wake-ups, and the GIL handed between
the loop and the compute thread around every numpy call) cost 100-150 us per inference
on a loaded 2-core machine, as much as the bundled tiny CNN's whole plan (125-160 us). A
plan holds the GIL for most of such a short run anyway, so a second stream adds little
parallelism; running it inline adds no hop. A run on input shapes whose runs took less
than ``CPU_INLINE_RUN_US`` of their thread's CPU time on average (not wall time, which
a loaded machine stretches) runs inline, whatever else runs: the requests of a queue
would otherwise keep one another on threads. The loop is held for about that long, with
a cancellation checkpoint before and a yield after (a task inferring in a loop must not
starve the others). Anything else, and the first run of new input shapes, goes to the
task executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio.lowlevel

from aioinfer.plugin.executors import Executor
from aioinfer.properties import Property, non_negative_int

T = TypeVar("T")

CPU_INLINE_RUN_US = Property(
    "CPU_INLINE_RUN_US",
    "CPU device: a plan whose last run on inputs of the same shapes took less than this "
    "many microseconds of CPU time runs on the event loop's thread, saving the hop to a "
    "compute thread (0: never).",
    default=300,
    parse=non_negative_int,
)

MAX_SHAPES = 64
"""Input shapes whose last run time is remembered (beyond: forgotten, measured again)."""


WEIGHT = 0.25
"""Weight of the latest run in the running average of run times: one run slowed by the
machine's load does not send the next ones to a thread."""


class RunTimes:
    """A compiled model's run times: CPU seconds, a running average per input shapes."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget = budget_seconds
        self.seconds: dict[Any, float] = {}

    def record(self, shapes: Any, seconds: float) -> None:
        """Note how long a run on inputs of ``shapes`` took (any thread)."""
        average = self.seconds.get(shapes)
        if average is None:
            if len(self.seconds) >= MAX_SHAPES:
                self.seconds.clear()
            average = seconds
        self.seconds[shapes] = average + WEIGHT * (seconds - average)

    def short(self, shapes: Any) -> bool:
        """Whether a run on ``shapes`` may run inline."""
        return self.seconds.get(shapes, self.budget) < self.budget


class RunExecutor(Executor):
    """The executor of one request's plan: inline when :class:`RunTimes` says the run
    is short, else ``threads`` (the task executor)."""

    name = "cpu-run"

    def __init__(self, threads: Executor, times: RunTimes, shapes: Callable[[], Any]) -> None:
        self._threads = threads
        self._times = times
        self._shapes = shapes

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        return (await self.run_timed(stage, on_cancel))[0]

    async def run_timed(
        self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None
    ) -> tuple[T, float]:
        if self._times.short(self._shapes()):
            # A cancel already asked for stops the run before it starts (once inline,
            # nothing can interrupt it).
            await anyio.lowlevel.checkpoint_if_cancelled()
            value = stage()
            await anyio.lowlevel.checkpoint()
            return value, 0.0
        return await self._threads.run_timed(stage, on_cancel)
