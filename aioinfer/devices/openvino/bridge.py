"""The bridge from OpenVINO's threads to the event loop: one :class:`Completion` per
inference.

OpenVINO finishes an inference on a thread of its own and calls the request's callback
there, but only when the inference succeeded: its Python binding drops the callback of
an inference that failed or was cancelled. So the callback (and ``cancel()``) *wake* the
completion thread-safely, and the awaiting side also looks at OpenVINO's request when a
check timer fires: a success is seen at once, a failure at the next check (the checks
back off from 5 ms to 100 ms, so a long inference costs a few loop wake-ups, a short one
none). No thread waits for an inference.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import anyio.lowlevel


class Completion:
    """The wake-up of one inference: :meth:`wake` from any thread, ``await wait(t)`` on
    the event loop the completion was made on."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False
        """Set (on the loop) when the inference's success callback woke the completion."""

    def wake(self, done: bool) -> None:
        """Wake the waiting side; ``done``: the inference succeeded (its callback ran).
        Never raises (it runs on OpenVINO's thread)."""

    async def wait(self, timeout: float) -> None:
        """Return when woken since the last call, or after ``timeout`` seconds."""


class NoCompletion(Completion):
    """For the synchronous path, which waits with OpenVINO's own ``wait()``."""

    __slots__ = ()


class AsyncioCompletion(Completion):
    """A completion on an asyncio loop: a bare future per wait, resolved by
    ``call_soon_threadsafe`` or by a ``call_later`` timer."""

    __slots__ = ("future", "loop", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.woken = False
        self.future: asyncio.Future[None] | None = None

    def wake(self, done: bool) -> None:
        # A loop that is closed has nobody waiting any more.
        with contextlib.suppress(Exception):
            self.loop.call_soon_threadsafe(self._set, done)

    def _set(self, done: bool) -> None:
        self.done = self.done or done
        self.woken = True
        _resolve(self.future)

    async def wait(self, timeout: float) -> None:
        if not self.woken:
            future = self.future = self.loop.create_future()
            timer = self.loop.call_later(timeout, _resolve, future)
            try:
                await future
            finally:
                timer.cancel()
                self.future = None
        self.woken = False


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class AnyioCompletion(Completion):
    """A completion on any other anyio backend (trio): an event set through the loop's
    token, waited for with a timeout."""

    __slots__ = ("event", "token")

    def __init__(self) -> None:
        super().__init__()
        self.token = anyio.lowlevel.current_token()
        self.event = anyio.Event()

    def wake(self, done: bool) -> None:
        with contextlib.suppress(Exception):  # the loop is gone: nobody waits
            self.token.backend_class.run_sync_soon(self._set, (done,), self.token.native_token)

    def _set(self, done: bool) -> None:
        self.done = self.done or done
        self.event.set()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self.event.wait()
        if self.event.is_set():
            self.event = anyio.Event()


def completion() -> Completion:
    """A completion for the running event loop."""
    try:
        return AsyncioCompletion(asyncio.get_running_loop())
    except RuntimeError:  # not asyncio (trio)
        return AnyioCompletion()


def on_success(completion: Any) -> None:
    """OpenVINO's callback (on its thread): the inference succeeded."""
    completion.wake(True)
