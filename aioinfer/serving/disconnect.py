"""Cancelling a request's work when its HTTP client goes away.

ASGI tells an app about a disconnect only through ``receive()``, so something must wait
on it while the work runs. Under asyncio that is a bare task that cancels the handler's
task, started only once the work has run for :data:`WATCH_AFTER` seconds: most
inferences end sooner, and a watcher per request costs about a tenth of the server's
time per request. Under other backends, an anyio task group watches from the start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Receive

T = TypeVar("T")

WATCH_AFTER = 0.05
"""Seconds of work after which (under asyncio) a disconnect is watched for: the work of
a client that went away stops at most this long after it went."""


class ClientDisconnectedError(Exception):
    """The client went away before its response was ready (its work was cancelled)."""


async def unless_disconnected(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work()``; cancel it when the client disconnects.

    Raises:
        ClientDisconnectedError: the client went away first.
        Whatever ``work()`` raises.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio)
        pass
    else:
        return await _on_asyncio(receive, work)
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
        raise _disconnected()
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


async def _on_asyncio(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch(task, receive)
    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watch.start)
    try:
        return await work()
    except asyncio.CancelledError:
        if not watch.disconnected:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        raise _disconnected() from None
    finally:
        timer.cancel()
        watch.stop()


def _disconnected() -> ClientDisconnectedError:
    return ClientDisconnectedError("the client disconnected; its inference was cancelled")
