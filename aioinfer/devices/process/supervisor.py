"""Keeping a PROCESS model's worker alive: a worker that died or hung is replaced.

The supervisor keeps what is needed to compile the model again (its bytes and config)
and the current worker. When a worker ends (killed, out of memory, or killed by its
monitor for missing heartbeats), the worker's monitor thread tells the supervisor,
which starts the next worker on that same thread: the event loop never waits for a
start. Meanwhile :meth:`WorkerSupervisor.ready` is False, new inferences wait for the
new worker, and the inferences the old one had fail with its ``death``
(:class:`WorkerDiedError` or :class:`WorkerTimeoutError`: retryable). A start that
fails is tried again after a pause that doubles from 1 s up to 30 s; meanwhile
inferences fail at once with :class:`DeviceUnavailableError`.

The PROCESS device keeps no state per request (``STATEFUL`` is refused), so a new
worker loses nothing but the inferences that were running.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio import RunFinishedError

from aioinfer.devices.process.channel import Channel
from aioinfer.devices.process.handle import STOP_TIMEOUT_SECONDS, WorkerHandle
from aioinfer.errors import (
    AioinferError,
    DeviceUnavailableError,
    RequestClosedError,
    WorkerDiedError,
)

RESTART_DELAY_SECONDS = 1.0
"""The pause after a failed start of a new worker; it doubles after each failure."""

MAX_RESTART_DELAY_SECONDS = 30.0

CONNECT_ATTEMPTS = 3
"""How many workers an inference tries to reach before it gives up (each attempt
waits for a new worker when the last one died before the inference reached it)."""


@dataclass(eq=False)
class Link:
    """An infer request's connection to one worker."""

    handle: WorkerHandle
    number: int
    """The request's number in that worker (cancels name it)."""
    channel: Channel
    seqs: itertools.count[int] = field(default_factory=itertools.count)
    """Numbers for the inferences sent on it (cancels name the one they mean)."""


class WorkerSupervisor:
    """The current worker of one PROCESS compiled model, replaced when it ends.

    Thread-safe; every wait has a blocking form (the synchronous path) and an async
    form that awaits on the caller's event loop (asyncio or trio).
    """

    def __init__(self, device_name: str, payload: dict[str, Any], timeout: float) -> None:
        self.device_name = device_name
        self.timeout = timeout
        self.restarts = 0
        """How many times a new worker replaced one that ended."""
        self._payload = payload
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._async_waiters: list[tuple[anyio.lowlevel.EventLoopToken, anyio.Event]] = []
        self._current: WorkerHandle | None = None
        self._failure: DeviceUnavailableError | None = None
        self._closed = False

    def start(self) -> dict[str, Any]:
        """Start the first worker and return its description of the compiled model.
        Blocks; raises the errors of :meth:`WorkerHandle.start`."""
        handle, info = WorkerHandle.start(
            self.device_name, self._payload, self.timeout, self._exited
        )
        with self._lock:
            self._current = handle
        if handle.death is not None:  # it died before it was current: nobody replaced it
            self._exited(handle)
        return info

    @property
    def worker(self) -> WorkerHandle | None:
        """The current worker (None while a new one starts; the last one once closed)."""
        return self._current

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None while a new worker starts)."""
        handle = self._current
        return None if handle is None else handle.pid

    def ready(self) -> bool:
        """Whether a worker runs that takes inferences now (False while a new one starts,
        and once closed)."""
        handle = self._current
        return not self._closed and handle is not None and handle.death is None

    # -- reaching the worker --------------------------------------------------------------

    def link(self, link: Link | None) -> Link:
        """``link`` when its worker is the current one, else a connection to the current
        worker, waiting while a new one starts. Blocks.

        Raises:
            DeviceUnavailableError: no worker could be reached (the last one's death, or
                why a new one could not start).
            RequestClosedError: the compiled model was closed.
        """
        error: AioinferError | None = None
        for _ in range(CONNECT_ATTEMPTS):
            with self._changed:
                while (handle := self._usable()) is None:
                    self._changed.wait()
            if link is not None:
                if link.handle is handle:
                    return link
                link.channel.close()  # a connection to a worker that ended
                link = None
            try:
                return Link(handle, *handle.connect())
            except EOFError:
                error = self.death_of(handle)
        assert error is not None
        raise error

    async def link_async(self, link: Link | None) -> Link:
        """:meth:`link` for the event loop: it awaits a new worker, and the connection's
        handshake runs on a thread."""
        error: AioinferError | None = None
        for _ in range(CONNECT_ATTEMPTS):
            while True:
                with self._lock:
                    handle = self._usable()
                    if handle is not None:
                        break
                    changed = self._waiter()
                await changed.wait()
            if link is not None:
                if link.handle is handle:
                    return link
                link.channel.close()  # a connection to a worker that ended
                link = None
            try:
                number, channel = await anyio.to_thread.run_sync(
                    handle.connect, abandon_on_cancel=True
                )
            except EOFError:
                error = await self.death_of_async(handle)
                continue
            return Link(handle, number, channel)
        assert error is not None
        raise error

    def death_of(self, handle: WorkerHandle) -> AioinferError:
        """The error of the inferences ``handle`` lost, once its monitor has recorded its
        death (an inference saw its connection end). Blocks (briefly)."""
        with self._changed:
            self._changed.wait_for(lambda: handle.death is not None, STOP_TIMEOUT_SECONDS)
        return self._error_of(handle)

    async def death_of_async(self, handle: WorkerHandle) -> AioinferError:
        """:meth:`death_of` for the event loop."""
        with anyio.move_on_after(STOP_TIMEOUT_SECONDS):
            while True:
                with self._lock:
                    if handle.death is not None:
                        break
                    changed = self._waiter()
                await changed.wait()
        return self._error_of(handle)

    def _error_of(self, handle: WorkerHandle) -> AioinferError:
        if self._closed:
            return RequestClosedError("the compiled model was closed")
        if handle.death is None:  # the connection ended, the worker did not
            handle.kill("closed an inference's connection")
            return WorkerDiedError(
                f"the {self.device_name} worker process (pid {handle.pid}) closed an "
                "inference's connection and was killed; the inference did not complete; a "
                "new worker is starting: retry the request"
            )
        return handle.death

    def _usable(self) -> WorkerHandle | None:
        """The current worker, or None while a new one starts (the lock is held).

        Raises:
            RequestClosedError: closed.
            DeviceUnavailableError: the last start of a new worker failed.
        """
        if self._closed:
            raise RequestClosedError("this compiled model is closed")
        handle = self._current
        if handle is not None and handle.death is None:
            return handle
        if self._failure is not None:
            raise self._failure
        return None

    # -- replacing the worker -------------------------------------------------------------

    def _exited(self, handle: WorkerHandle) -> None:
        """A worker ended (on its monitor thread): when it was the current one, start the
        next one here."""
        with self._lock:
            replace = handle is self._current and not self._closed
            if replace:
                self._current = None
            self._notify()
        if replace:
            self._restart()

    def _restart(self) -> None:
        delay = RESTART_DELAY_SECONDS
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                handle, _ = WorkerHandle.start(
                    self.device_name, self._payload, self.timeout, self._exited
                )
            except Exception as exc:  # recorded: inferences report it until a start works
                with self._changed:
                    self._failure = DeviceUnavailableError(
                        f"the {self.device_name} worker process died and a new one could "
                        f"not start ({type(exc).__name__}: {exc}); the next attempt is in "
                        f"{delay:g} s: retry the request later"
                    )
                    self._notify()
                    self._changed.wait_for(lambda: self._closed, delay)
                delay = min(2 * delay, MAX_RESTART_DELAY_SECONDS)
                continue
            with self._lock:
                closed = self._closed
                if not closed:
                    self._current, self._failure = handle, None
                    self.restarts += 1
                    self._notify()
            if closed:
                handle.stop()
            elif handle.death is not None:  # it died before it was current
                self._exited(handle)
            return

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Start no new worker any more; inferences waiting for one fail with
        :class:`RequestClosedError`."""
        with self._lock:
            self._closed = True
            self._notify()

    def stop(self) -> None:
        """:meth:`close`, then stop the current worker (see :meth:`WorkerHandle.stop`).
        Blocks."""
        self.close()
        handle = self._current
        if handle is not None:
            handle.stop()

    def abandon(self) -> None:
        """:meth:`close`, and ask the current worker to exit without waiting."""
        self.close()
        handle = self._current
        if handle is not None:
            handle.abandon()

    # -- waiters --------------------------------------------------------------------------

    def _waiter(self) -> anyio.Event:
        """An event set at the next change (the lock is held; on an event loop)."""
        event = anyio.Event()
        self._async_waiters.append((anyio.lowlevel.current_token(), event))
        return event

    def _notify(self) -> None:
        """Wake every waiter: threads and event loops (the lock is held; any thread)."""
        self._changed.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for token, event in waiters:
            with contextlib.suppress(RunFinishedError):  # that loop has ended
                token.backend_class.run_sync_soon(event.set, (), token.native_token)
