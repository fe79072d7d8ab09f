"""Messages between the application and a PROCESS worker: pickled, framed, resumable.

A message is an 8-byte big-endian length and a pickle (protocol 4: the arrays it
unpickles own their memory). In the application the sockets are non-blocking, and a
read or write that cannot complete keeps its place: the event loop awaits readiness
between the parts (``anyio.wait_readable``/``wait_writable``), a thread polls. So a
worker that stops reading or answering never blocks the loop; the heartbeat (see
:mod:`aioinfer.devices.process.handle`) kills it, and the waiting end sees the
connection close. In the worker the sockets stay blocking: each has a thread there.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import socket
import struct
from multiprocessing.connection import Connection
from typing import Any

import anyio

HEADER = struct.Struct("!Q")

INCOMPLETE: Any = object()
"""What :meth:`Channel.read` returns while the message has not fully arrived."""


def encode(message: Any) -> memoryview:
    """``message`` framed: its length, then its pickle."""
    stream = io.BytesIO()
    stream.write(bytes(HEADER.size))
    pickle.dump(message, stream, protocol=4)
    frame = stream.getbuffer()
    HEADER.pack_into(frame, 0, len(frame) - HEADER.size)
    return frame


class Channel:
    """One end of an authenticated connection, sending and receiving whole messages.

    ``queue``/``flush`` and ``read`` never block on a non-blocking socket: what could
    not be written stays queued, what has partly arrived stays buffered, and the next
    call goes on from there. Not thread-safe: one reader, and one writer at a time.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection  # owns the socket: closing it closes the socket
        self.fd = connection.fileno()
        self._out: list[memoryview] = []
        self._header = bytearray(HEADER.size)
        self._body: bytearray | None = None
        self._filled = 0
        self.interrupted = False
        """Whether :meth:`interrupt` ended the connection (its owner must close it)."""

    @property
    def pending(self) -> bool:
        """Whether queued bytes wait to be written."""
        return bool(self._out)

    @property
    def torn(self) -> bool:
        """Whether a message is half written or half read (the stream cannot be reused
        by someone who gives up on it)."""
        return bool(self._out) or self._filled > 0 or self._body is not None

    def queue(self, message: Any) -> None:
        """Queue ``message`` for :meth:`flush`."""
        self._out.append(encode(message))

    def flush(self) -> bool:
        """Write queued bytes until none are left (True) or the socket is full (False).

        Raises:
            OSError: the other end is gone (``BrokenPipeError``, ``ConnectionResetError``).
        """
        while self._out:
            frame = self._out[0]
            try:
                written = os.write(self.fd, frame)
            except BlockingIOError:
                return False
            if written == len(frame):
                self._out.pop(0)
            else:
                self._out[0] = frame[written:]
        return True

    def read(self) -> Any:
        """The next message, or :data:`INCOMPLETE` while it has not fully arrived.

        Raises:
            EOFError: the other end closed the connection.
            OSError: the connection broke.
        """
        while True:
            buffer = self._header if self._body is None else self._body
            if self._filled < len(buffer):
                try:
                    count = os.readv(self.fd, [memoryview(buffer)[self._filled :]])
                except BlockingIOError:
                    return INCOMPLETE
                if count == 0:
                    raise EOFError("the other end closed the connection")
                self._filled += count
            elif self._body is None:
                (size,) = HEADER.unpack(self._header)
                self._body, self._filled = bytearray(size), 0
            else:
                body, self._body, self._filled = self._body, None, 0
                return pickle.loads(body)

    # -- waiting --------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Send ``message``, blocking the calling thread until it is written."""
        self.queue(message)
        while not self.flush():
            _poll(self.fd, select.POLLOUT)

    def receive(self) -> Any:
        """The next message, blocking the calling thread until it has arrived."""
        while (message := self.read()) is INCOMPLETE:
            _poll(self.fd, select.POLLIN)
        return message

    async def send_async(self, message: Any) -> None:
        """Send ``message``; the event loop awaits room in the socket between parts."""
        self.queue(message)
        while not self.flush():
            await anyio.wait_writable(self.fd)

    async def receive_async(self) -> Any:
        """The next message; the event loop awaits its parts."""
        while (message := self.read()) is INCOMPLETE:
            await anyio.wait_readable(self.fd)
        return message

    def interrupt(self) -> None:
        """End the connection both ways without closing the socket, from any thread: a
        read waiting on it (on the event loop, in a thread) sees its end at once, and so
        does the other end. The owner closes it when it sees :attr:`interrupted`."""
        self.interrupted = True
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self.fd)) as end:
            end.shutdown(socket.SHUT_RDWR)  # the socket's, through a descriptor of our own

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self._connection.close()


def _poll(fd: int, events: int) -> None:
    poller = select.poll()
    poller.register(fd, events)
    poller.poll()
