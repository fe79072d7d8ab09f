"""Executors: where a pipeline stage runs.

A stage is a plain callable; an executor turns it into something the event loop can
await. :class:`LoopExecutor` runs the stage inline on the loop (for cheap stages);
:class:`ThreadExecutor` runs it on one of its worker threads while the awaiting task
sleeps, so the loop stays free; :class:`AwaitExecutor` awaits a stage that is itself a
coroutine function (a stage that waits for a batch, a worker process or an engine's own
threads). All work under asyncio and trio.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

import anyio
import anyio.lowlevel
from anyio import RunFinishedError

T = TypeVar("T")


class Executor(ABC):
    """Runs stages for the async pipeline."""

    name: str
    inline = False
    """True when the stage runs inline on the loop's thread, so nothing interrupts it: the
    pipeline then calls the stage itself rather than awaiting :meth:`run`."""

    @abstractmethod
    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        """Run ``stage`` and return its result.

        If the awaiting task is cancelled while the stage runs elsewhere, ``on_cancel`` is
        called (it should make the stage stop soon), the executor waits until the stage
        has let go, and the cancellation propagates. A stage cancelled before it started
        never runs.
        """

    async def run_timed(
        self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None
    ) -> tuple[T, float]:
        """:meth:`run`, and the seconds the stage waited in this executor's queue before it
        started (0 for an executor that starts it at once)."""
        return await self.run(stage, on_cancel), 0.0

    def close(self) -> None:
        """Release the executor's resources; stages already running finish."""


class LoopExecutor(Executor):
    """Runs each stage inline, on the event loop's thread."""

    name = "loop"
    inline = True

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        return stage()

    async def run_timed(
        self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None
    ) -> tuple[T, float]:
        return stage(), 0.0


class AwaitExecutor(Executor):
    """Runs a stage that is a coroutine function, on the event loop.

    For a stage that waits for something else (its batch, a reply) rather than
    computing: cancelling the awaiting task reaches the stage itself, so ``on_cancel`` is
    not needed.
    """

    name = "await"

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        return cast("T", await cast("Any", stage()))

    async def run_timed(
        self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None
    ) -> tuple[T, float]:
        return cast("T", await cast("Any", stage())), 0.0


def streams_for(config: Mapping[str, Any], cores: int) -> int:
    """The compute streams a parsed config asks for: ``NUM_STREAMS`` when it is a number,
    else one under the ``LATENCY`` hint and ``cores`` under ``THROUGHPUT``."""
    if config["NUM_STREAMS"] != "AUTO":
        return int(config["NUM_STREAMS"])
    return max(1, cores) if config["PERFORMANCE_HINT"] == "THROUGHPUT" else 1


_STOP = object()


class LoopEvent(Protocol):
    """What :func:`loop_event` returns: an event waited for on the event loop."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


def loop_event() -> LoopEvent:
    """A new event of the running event loop: asyncio's own under asyncio, anyio's
    elsewhere. A stage hand-off makes one per stage: anyio's wrapper finds the backend
    each time it is made, several times the cost of asyncio's event (profiled: about 4
    against 0.4 us, and 4 more for ``current_token()``; a fifth of the loop's work per
    inference on a small model)."""
    if asyncio_loop() is not None:
        return asyncio.Event()
    return anyio.Event()


def asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop of this thread; None under another backend."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Job:
    """A stage handed to a worker thread, and how it ended."""

    __slots__ = (
        "done",
        "lock",
        "loop",
        "ok",
        "stage",
        "started",
        "submitted",
        "token",
        "value",
        "waited",
    )

    def __init__(self, stage: Callable[[], Any]) -> None:
        self.stage: Callable[[], Any] | None = stage
        self.loop = asyncio_loop()
        self.token = None if self.loop is not None else anyio.lowlevel.current_token()
        self.done: LoopEvent = asyncio.Event() if self.loop is not None else anyio.Event()
        self.lock = threading.Lock()
        self.started = False
        self.ok = False
        self.value: Any = None
        self.submitted = time.perf_counter()
        self.waited = 0.0
        """Seconds from submission until a worker thread started the stage."""

    def __call__(self) -> None:
        with self.lock:
            stage, self.stage = self.stage, None
            if stage is None:  # abandoned before it started
                return
            self.started = True
        self.waited = time.perf_counter() - self.submitted
        try:
            self.value, self.ok = stage(), True
        except BaseException as exc:  # handed back to the awaiting task
            self.value = exc
        # If the loop is gone, nobody waits for this stage any more.
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.call_soon_threadsafe(self.done.set)
        else:
            assert self.token is not None
            with contextlib.suppress(RunFinishedError):
                self.token.backend_class.run_sync_soon(self.done.set, (), self.token.native_token)

    def abandon(self) -> bool:
        """Drop the job if no worker took it yet; True when it will never run."""
        with self.lock:
            if self.started:
                return False
            self.stage = None
            return True


class ThreadExecutor(Executor):
    """A pool of ``workers`` daemon threads; at most ``workers`` stages run at once.

    Threads start on first use and never keep the interpreter from exiting. With
    ``nice`` > 0 each thread lowers its own scheduling priority by that much when it starts
    (see :func:`lower_thread_priority`).
    """

    def __init__(self, name: str, workers: int, nice: int = 0) -> None:
        if workers < 1:
            raise ValueError("an executor needs at least one worker")
        self.name = name
        self.workers = workers
        self.nice = nice
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` for a worker thread (a job must not raise)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"executor {self.name!r} is closed")
            if len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._work,
                    name=f"aioinfer-{self.name}-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        self._jobs.put(job)

    def _work(self) -> None:
        if self.nice:
            lower_thread_priority(self.nice)
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            job()

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        return (await self.run_timed(stage, on_cancel))[0]

    async def run_timed(
        self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None
    ) -> tuple[T, float]:
        job = _Job(stage)
        self.submit(job)
        try:
            await job.done.wait()
        except anyio.get_cancelled_exc_class():
            if not job.abandon():
                if on_cancel is not None:
                    on_cancel()
                with anyio.CancelScope(shield=True):
                    await job.done.wait()
            raise
        if job.ok:
            return job.value, job.waited
        raise job.value

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._jobs.put(_STOP)


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by ``nice`` (Linux: priorities are per
    thread, and threads it creates afterwards inherit them). Compute threads below the
    event loop's priority let the loop's thread take a core as soon as it wakes when the
    cores are oversubscribed. Lowering a priority needs no privilege; the thread cannot
    raise it again.

    Raises:
        OSError: the system refused.
    """
    os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + nice)


_background: set[Any] = set()


def spawn_detached(start: Callable[[], Awaitable[None]]) -> None:
    """Run ``start()`` as a task of the current event loop, outside any task group.

    Used by ``start_async``, which returns at once while the inference goes on. The
    coroutine must catch its own exceptions.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import trio  # the only other backend anyio supports

        trio.lowlevel.spawn_system_task(start)
        return
    task: asyncio.Task[None] = loop.create_task(start())  # type: ignore[arg-type]
    _background.add(task)
    task.add_done_callback(_background.discard)
