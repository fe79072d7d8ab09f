"""Executors: where a pipeline stage runs.

A stage is a plain callable; an executor turns it into something the event loop can
await. :class:`LoopExecutor` runs the stage inline on the loop (for cheap stages);
:class:`ThreadExecutor` runs it on one of its worker threads while the awaiting task
sleeps, so the loop stays free. Both work under asyncio and trio.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from anyio import RunFinishedError

T = TypeVar("T")


class Executor(ABC):
    """Runs stages for the async pipeline."""

    name: str

    @abstractmethod
    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        """Run ``stage`` and return its result.

        If the awaiting task is cancelled while the stage runs elsewhere, ``on_cancel`` is
        called (it should make the stage stop soon), the executor waits until the stage
        has let go, and the cancellation propagates.
        """

    def close(self) -> None:
        """Release the executor's resources; stages already running finish."""


class LoopExecutor(Executor):
    """Runs each stage inline, on the event loop's thread."""

    name = "loop"

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        return stage()


_STOP = object()


class ThreadExecutor(Executor):
    """A pool of ``workers`` daemon threads; at most ``workers`` stages run at once.

    Threads start on first use and never keep the interpreter from exiting.
    """

    def __init__(self, name: str, workers: int) -> None:
        if workers < 1:
            raise ValueError("an executor needs at least one worker")
        self.name = name
        self.workers = workers
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
                self._start_worker()
        self._jobs.put(job)

    def _start_worker(self) -> None:
        number = len(self._threads)
        thread = threading.Thread(
            target=self._work, name=f"aioinfer-{self.name}-{number}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            job()

    async def run(self, stage: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
        token = anyio.lowlevel.current_token()
        done = anyio.Event()
        outcome: list[Any] = []

        def job() -> None:
            try:
                outcome.append((True, stage()))
            except BaseException as exc:  # handed back to the awaiting task
                outcome.append((False, exc))
            try:
                token.backend_class.run_sync_soon(done.set, (), token.native_token)
            except RunFinishedError:
                pass  # the loop is gone; nobody waits for this stage any more

        self.submit(job)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            if on_cancel is not None:
                on_cancel()
            with anyio.CancelScope(shield=True):
                await done.wait()
            raise
        ok, value = outcome[0]
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._jobs.put(_STOP)
