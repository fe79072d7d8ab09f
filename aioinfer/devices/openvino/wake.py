"""Waking the event loop from OpenVINO's threads, for the queue engine.

asyncio's ``call_soon_threadsafe`` writes to the loop's socket with the GIL released.
The loop wakes and takes the GIL, and the thread that wrote must wait for the loop's
whole turn to get it back. In the queue engine that thread is OpenVINO's stream thread,
in the completion callback, with the next job already queued on it: the stream waits
instead of computing. So on Linux the queue's loop also watches an eventfd of its own,
which the callback writes to with a libc call that keeps the GIL (a write to an eventfd
never blocks). Then the loop waits for the GIL instead of the stream (the figures:
docs/benchmarks.md, "The OPENVINO queue engine").

Under trio the same eventfd is watched by a system task of the run
(``trio.lowlevel.wait_readable``) instead of waking the run through its token, whose
wake-up socket is written with the GIL released as asyncio's is.

Elsewhere (no eventfd, another anyio backend) the loop is woken as any other thread
would wake it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import anyio.lowlevel

from aioinfer.plugin.executors import asyncio_loop


def _gil_keeping_write() -> Any:
    """libc's ``write``, called with the GIL held (``ctypes.PyDLL``); None where there
    is no eventfd or no such symbol."""
    if not hasattr(os, "eventfd"):
        return None
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError):
        return None
    write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    write.restype = ctypes.c_ssize_t
    return write


_WRITE = _gil_keeping_write()
_ONE = ctypes.c_uint64(1)
_ONE_ADDRESS = ctypes.addressof(_ONE)


class LoopWake:
    """Calls ``call()`` on the event loop running now, when asked from any thread
    (nothing once the loop is gone: nobody waits any more)."""

    def __call__(self) -> None:
        """Schedule ``call()`` on the loop. Never raises."""

    def detach(self) -> None:
        """Stop calling (on the loop's thread); later wakes do nothing."""


class _EventfdWake(LoopWake):
    """An eventfd the loop watches; written with the GIL kept (see the module). The fd
    stays open until this object is collected, so that a wake racing with
    :meth:`detach` writes to it, not to another file given its number."""

    def __init__(self, loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._loop = loop
        loop.add_reader(self._fd, _drain_and_call, self._fd, call)
        weakref.finalize(self, _close, loop, self._fd)

    def __call__(self) -> None:
        _WRITE(self._fd, _ONE_ADDRESS, 8)

    def detach(self) -> None:
        with contextlib.suppress(Exception):  # the loop is closed
            self._loop.remove_reader(self._fd)


def _drain_and_call(fd: int, call: Callable[[], None]) -> None:
    with contextlib.suppress(BlockingIOError):
        os.eventfd_read(fd)
    call()


def _close(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Unregister and close ``fd`` on its loop's thread (or at once: the loop closed)."""

    def unregister() -> None:
        with contextlib.suppress(Exception):
            loop.remove_reader(fd)
        os.close(fd)

    try:
        loop.call_soon_threadsafe(unregister)
    except RuntimeError:
        os.close(fd)


class _SoonWake(LoopWake):
    def __init__(self, loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
        self._call_soon = loop.call_soon_threadsafe
        self._call: Callable[[], None] | None = call

    def __call__(self) -> None:
        call = self._call
        if call is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._call_soon(call)

    def detach(self) -> None:
        self._call = None


class _TrioEventfdWake(LoopWake):
    """Under trio: an eventfd a system task of the run waits on, written with the GIL
    kept. The fd stays open until this object is collected (a wake racing with
    :meth:`detach` writes to it, not to another file given its number) and the task
    has ended; the task ends when detached, when the run ends, or once this object is
    collected."""

    def __init__(self, call: Callable[[], None]) -> None:
        import trio  # only under trio

        self._watch = watch = _EventfdWatch(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
        self._scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(watch.run, call, self._scope, name="aioinfer-openvino-wake")
        weakref.finalize(self, watch.collected)

    def __call__(self) -> None:
        _WRITE(self._watch.fd, _ONE_ADDRESS, 8)

    def detach(self) -> None:
        self._scope.cancel()


class _EventfdWatch:
    """The eventfd of a :class:`_TrioEventfdWake` and the task that waits on it; closed
    by whichever of the task's end and the wake's collection comes last."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self._ended = False
        self._collected = False

    async def run(self, call: Callable[[], None], scope: Any) -> None:
        import trio

        try:
            with scope:
                while True:
                    await trio.lowlevel.wait_readable(self.fd)
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self.fd)
                    if self._collected:
                        return
                    call()
        finally:
            with self._lock:
                self._ended = True
                if self._collected:
                    os.close(self.fd)

    def collected(self) -> None:
        """The wake was collected (any thread): close the fd, or end the task first."""
        with self._lock:
            self._collected = True
            if self._ended:
                os.close(self.fd)
            else:
                _WRITE(self.fd, _ONE_ADDRESS, 8)  # the task wakes, ends and closes it


def _in_trio() -> bool:
    """Whether this runs in a trio run (trio imported by anyio's backend, if at all)."""
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


class _TokenWake(LoopWake):
    """Under trio (any anyio backend but asyncio): the loop's token."""

    def __init__(self, call: Callable[[], None]) -> None:
        self._token = anyio.lowlevel.current_token()
        self._call: Callable[[], None] | None = call

    def __call__(self) -> None:
        call, token = self._call, self._token
        if call is not None:
            with contextlib.suppress(Exception):  # the run has finished
                token.backend_class.run_sync_soon(call, (), token.native_token)

    def detach(self) -> None:
        self._call = None


def loop_wake(call: Callable[[], None]) -> LoopWake:
    """A :class:`LoopWake` of ``call`` for the running event loop (call it on the loop).
    ``call`` should hold its owner weakly: the loop keeps it while attached."""
    loop = asyncio_loop()
    if loop is None:
        if _WRITE is not None and _in_trio():
            return _TrioEventfdWake(call)
        return _TokenWake(call)
    if _WRITE is not None:
        return _EventfdWake(loop, call)
    return _SoonWake(loop, call)
