"""Cancelling a request's work when its HTTP client goes away.

ASGI tells an app about a disconnect only through ``receive()``, so something must wait
on it while the work runs. Under asyncio that is a bare task that cancels the handler's
task, started only once the work has run for :data:`WATCH_AFTER` seconds: most
inferences end sooner, and a watcher per request costs about a tenth of the server's
time per request. One timer per event loop (not one per request) starts the watchers
that are due, every half :data:`WATCH_AFTER`. Under other backends, an anyio task group
watches from the start.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Receive

from aioinfer.errors import ClientDisconnectedError

T = TypeVar("T")

WATCH_AFTER = 0.05
"""Seconds of work after which (under asyncio) a disconnect is watched for: the work of
a client that went away stops at most one and a half times this long after it went."""


async def unless_disconnected(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work()``; cancel it when the client disconnects.

    Raises:
        ClientDisconnectedError: the client went away first.
        Whatever ``work()`` raises.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio)
        pass
    else:
        return await _on_asyncio(loop, receive, work)
    outcome: list[Any] = []

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            outcome.append(await work())
        except Exception as exc:  # re-raised below, outside the task group
            outcome.append(exc)
        group.cancel_scope.cancel()
    if not outcome:
        raise disconnected_error()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


class _Watch:
    """Cancels ``task`` when the client disconnects, once :meth:`start` was called."""

    __slots__ = ("disconnected", "receive", "task", "watcher")

    def __init__(self, task: asyncio.Task[Any], receive: Receive) -> None:
        self.task = task
        self.receive = receive
        self.disconnected = False
        self.watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.watcher = asyncio.ensure_future(self.watch())

    async def watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self.task.cancel()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()


class _Sweeper:
    """Starts the watches of one event loop that are due: one timer, every half
    :data:`WATCH_AFTER`, while any work is in progress."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[_Watch, float] = {}
        """Watches not started yet, and when each is due (in arrival order)."""
        self.timer: asyncio.TimerHandle | None = None

    def add(self, watch: _Watch) -> None:
        self.pending[watch] = self.loop.time() + WATCH_AFTER
        if self.timer is None:
            self.timer = self.loop.call_later(WATCH_AFTER / 2, self.sweep)

    def sweep(self) -> None:
        self.timer = None
        now = self.loop.time()
        for watch, due in list(self.pending.items()):
            if due > now:
                break  # the rest came later
            del self.pending[watch]
            watch.start()
        if self.pending:
            self.timer = self.loop.call_later(WATCH_AFTER / 2, self.sweep)


_local = threading.local()


def _sweeper(loop: asyncio.AbstractEventLoop) -> _Sweeper:
    """The sweeper of ``loop`` (one event loop runs in a thread at a time)."""
    sweeper: _Sweeper | None = getattr(_local, "sweeper", None)
    if sweeper is None or sweeper.loop is not loop:
        sweeper = _local.sweeper = _Sweeper(loop)
    return sweeper


async def _on_asyncio(
    loop: asyncio.AbstractEventLoop, receive: Receive, work: Callable[[], Awaitable[T]]
) -> T:
    task = asyncio.current_task(loop)
    assert task is not None
    watch = _Watch(task, receive)
    sweeper = _sweeper(loop)
    sweeper.add(watch)
    try:
        return await work()
    except asyncio.CancelledError:
        if not watch.disconnected:
            raise
        raise disconnected_instead_of(task) from None
    finally:
        sweeper.pending.pop(watch, None)
        watch.stop()


def disconnected_instead_of(task: asyncio.Task[Any] | None) -> ClientDisconnectedError:
    """The error to raise instead of the cancellation of ``task`` that a disconnect made:
    the cancellation is taken back (``uncancel``, Python 3.11+), so that the task's
    later awaits are not cancelled again."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()
    return disconnected_error()


def disconnected_error() -> ClientDisconnectedError:
    """The error of an inference cancelled because its client went away."""
    return ClientDisconnectedError("the client disconnected; its inference was cancelled")
