"""Cancelling a request's work when its HTTP client goes away.

ASGI tells an app about a disconnect only through ``receive()``, so something must wait
on it while the work runs. Under asyncio that is a bare task that cancels the handler's
task (a task group costs several times more, per request); under other backends, an
anyio task group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Receive

T = TypeVar("T")


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


async def _on_asyncio(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    task = asyncio.current_task()
    assert task is not None
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work()
    except asyncio.CancelledError:
        if not disconnected:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        raise _disconnected() from None
    finally:
        watcher.cancel()


def _disconnected() -> ClientDisconnectedError:
    return ClientDisconnectedError("the client disconnected; its inference was cancelled")
