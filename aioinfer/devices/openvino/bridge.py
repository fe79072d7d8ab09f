"""The bridge from OpenVINO to the event loop: a :class:`Waiter` thread per request
tells a :class:`Completion` on the loop when an inference ended.

OpenVINO's own callback is not used, for two reasons measured on OpenVINO 2026.4:

- Its Python binding calls no callback for an inference that failed or was cancelled
  (it re-raises the engine's exception inside its wrapper before it takes the GIL), so
  a failure could only be found by looking at the request on a timer: 5 to 100 ms late.
- OpenVINO's CPU device runs the callback on the stream thread that computed, and a
  Python callback must take the GIL there: while the event loop's thread holds it (or is
  descheduled holding it, on a loaded machine) the stream stalls. On SqueezeNet with
  two streams, a loop fed by callbacks reached 164-173 inferences/s, fed by waiting
  threads 240-282 (two requests, alternating rounds; tiny and small CNNs: equal).

(The queue engine, :mod:`.queue_engine`, does use the callback: it keeps the thread
state the binding would make per call, wakes the loop without giving up the GIL, and
finds failures with a watch thread; see there.)

A waiter blocks in OpenVINO's ``wait()`` (the GIL released), which returns on success,
failure and cancellation alike, and then wakes the completion thread-safely. It is one
daemon thread per request that has awaited an inference, idle between inferences; no
OpenVINO thread ever runs Python code. The synchronous path waits in ``wait()`` itself.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import queue
import threading
import weakref
from typing import Any

import anyio
import anyio.lowlevel

LET_GO_CHECK_MS = 1
"""Milliseconds each look at a cancelled request waits for it to end (the GIL released)."""


class Completion:
    """The end of one inference: :meth:`wake` from any thread, ``await wait()`` on the
    event loop the completion was made on."""

    __slots__ = ("finished",)

    def __init__(self) -> None:
        self.finished = False
        """Set (on the loop) once the inference ended, however it ended."""

    def wake(self) -> None:
        """Tell the waiting side that the inference ended. Never raises (it runs on the
        waiter's thread)."""

    async def wait(self) -> None:
        """Return once :attr:`finished`."""


class NoCompletion(Completion):
    """For the synchronous path, which waits with OpenVINO's own ``wait()``."""

    __slots__ = ()


class AsyncioCompletion(Completion):
    """A completion on an asyncio loop: a bare future, resolved by
    ``call_soon_threadsafe``."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> None:
        # A loop that is closed has nobody waiting any more.
        with contextlib.suppress(Exception):
            self.loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        self.finished = True
        if not self.future.done():
            self.future.set_result(None)

    async def wait(self) -> None:
        while not self.finished:
            if self.future.done():  # cancelled with the task that awaited it
                self.future = self.loop.create_future()
            await self.future


class AnyioCompletion(Completion):
    """A completion on any other anyio backend (trio): an event set through the loop's
    token."""

    __slots__ = ("event", "token")

    def __init__(self) -> None:
        super().__init__()
        self.token = anyio.lowlevel.current_token()
        self.event = anyio.Event()

    def wake(self) -> None:
        with contextlib.suppress(Exception):  # the loop is gone: nobody waits
            self.token.backend_class.run_sync_soon(self._set, (), self.token.native_token)

    def _set(self) -> None:
        self.finished = True
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


def completion() -> Completion:
    """A completion for the running event loop."""
    try:
        return AsyncioCompletion(asyncio.get_running_loop())
    except RuntimeError:  # not asyncio (trio)
        return AnyioCompletion()


class Waiter:
    """A daemon thread that waits for the inferences of one OpenVINO request, one at a
    time, and wakes each one's completion when it ended."""

    def __init__(self, ov_request: Any) -> None:
        self._inbox: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        self._ov_request = ov_request
        self._thread = threading.Thread(
            target=_wait_for_each,
            args=(ov_request, self._inbox),
            name="aioinfer-openvino-wait",
            daemon=True,
        )
        self._thread.start()
        stop_at_exit(self)

    def watch(self, completion: Completion) -> None:
        """Wake ``completion`` when the inference just started ends."""
        self._inbox.put(completion)

    def close(self) -> None:
        """Let the thread end (once the inference it waits for, if any, ended)."""
        self._inbox.put(None)

    def stop_at_exit(self) -> None:
        """Cancel the inference waited for, if any, and end the thread (at interpreter
        exit: see :func:`stop_threads_at_exit`)."""
        self._ov_request.cancel()
        self.close()
        self._thread.join(EXIT_JOIN_SECONDS)


EXIT_JOIN_SECONDS = 10.0
"""How long interpreter exit waits for each waiting thread (a hang guard: a cancelled
inference ends at OpenVINO's next node)."""
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
"""The waiters and queue engines whose threads :func:`stop_threads_at_exit` ends."""


@atexit.register
def stop_threads_at_exit() -> None:
    """End the threads that wait in OpenVINO before the interpreter finalizes: a daemon
    thread that comes back from OpenVINO's ``wait()`` once finalization has begun is
    ended by Python from inside the binding's C++ frames, and the process aborts
    ("terminate called without an active exception": eight exits in ten with two
    jobs of an unclosed ``AsyncInferQueue`` in flight, whose jobs no task of asyncio.run
    cancels)."""
    for owner in list(_LIVE):
        owner.stop_at_exit()


def stop_at_exit(owner: Any) -> None:
    """Have :func:`stop_threads_at_exit` call ``owner.stop_at_exit()``."""
    _LIVE.add(owner)


def _wait_for_each(ov_request: Any, inbox: queue.SimpleQueue[Completion | None]) -> None:
    while True:
        completion = inbox.get()
        if completion is None:
            return
        # The outcome (a failure, a cancel) is read on the loop, by wait() again.
        try:
            ov_request.wait()
        except RuntimeError:
            let_go(ov_request)
        completion.wake()


def let_go(ov_request: Any) -> None:
    """Return once a request whose ``wait()`` raised has ended: a cancelled request's
    ``wait()`` raises at once, while OpenVINO still runs it up to its next node (and
    refuses to start it again until then); ``wait_for`` says when that is over."""
    with contextlib.suppress(RuntimeError):  # the end of a cancelled run raises
        while not ov_request.wait_for(LET_GO_CHECK_MS):
            pass
