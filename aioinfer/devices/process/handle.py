"""The parent's side of a PROCESS worker: start it, talk to it, notice its death, stop it."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import weakref
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import aioinfer
from aioinfer.devices.process import worker
from aioinfer.errors import CompileError, InferenceError

STOP_TIMEOUT_SECONDS = 5.0
"""How long ``stop`` waits for the worker to exit after asking it to, before it
terminates it."""


class WorkerHandle:
    """A running worker process and its connections: one control connection and one
    connection per infer request.

    ``connect``, ``send``, ``receive`` and ``read_property`` raise
    :class:`InferenceError` naming the device and the exit code once the worker has died,
    and keep raising it.
    """

    def __init__(self, device_name: str, process: subprocess.Popen[bytes]) -> None:
        self.device_name = device_name
        self.process = process
        """The worker process (``process.pid``, ``process.returncode``)."""
        self._address: Any = None
        self._authkey = os.urandom(32)
        self._control: Connection | None = None
        self._control_lock = threading.Lock()
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._numbers = itertools.count()
        self._seq = itertools.count()
        self._death: InferenceError | None = None
        self._death_lock = threading.Lock()
        self._stopped = False

    @classmethod
    def start(
        cls, device_name: str, payload: dict[str, Any]
    ) -> tuple[WorkerHandle, dict[str, Any]]:
        """Start a worker and have it compile ``payload``; return the handle and the
        worker's description of the compiled model (see
        :func:`aioinfer.devices.process.worker.describe`).

        Raises:
            AioinferError: the compile failed in the worker (its class and message).
            CompileError: the worker died, or could not be reached, while compiling.
        """
        # The worker imports this aioinfer, wherever it was imported from.
        root = str(Path(aioinfer.__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "aioinfer.devices.process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        handle = cls(device_name, process)
        try:
            assert process.stdin is not None and process.stdout is not None
            with process.stdin:
                process.stdin.write(handle._authkey.hex().encode() + b"\n")
            with process.stdout:
                handle._address = process.stdout.readline().decode().strip()
            if not handle._address:
                raise EOFError("the worker ended before it listened")
            handle._control = Client(handle._address, authkey=handle._authkey)
            handle._control.send(("compile", payload))
            reply = handle._control.recv()
        except (EOFError, OSError, AuthenticationError) as exc:
            handle.stop()
            raise CompileError(
                f"the {device_name} worker process (pid {process.pid}) ended while compiling "
                f"the model (exit code {process.returncode}; {type(exc).__name__}: {exc})"
            ) from None
        if reply[0] == "error":
            handle.stop()
            raise worker.error_from(reply)
        return handle, reply[1]

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    # -- inferences -----------------------------------------------------------------------

    def connect(self) -> tuple[int, Connection]:
        """A new connection for one infer request, and its number (cancels name it).

        Raises:
            InferenceError: the worker has died.
        """
        if self._death is not None:
            raise self._death
        number = next(self._numbers)
        try:
            connection = Client(self._address, authkey=self._authkey)
            connection.send(number)
        except (EOFError, OSError, AuthenticationError):
            raise self.died() from None
        self._connections.add(connection)
        return number, connection

    def next_seq(self) -> int:
        """A number for the next inference (cancels name the inference they mean)."""
        return next(self._seq)

    def send(self, connection: Connection, seq: int, inputs: list[Any]) -> None:
        """Send inference ``seq`` on a request's connection.

        Raises:
            InferenceError: the worker has died.
        """
        if self._death is not None:
            raise self._death
        try:
            _blocking(connection)
            connection.send((seq, inputs))
        except OSError:
            raise self.died() from None

    def receive(self, connection: Connection) -> tuple[Any, ...]:
        """The reply to the inference sent on ``connection`` (blocks until it arrives).

        Raises:
            InferenceError: the worker has died.
        """
        try:
            _blocking(connection)
            reply: tuple[Any, ...] = connection.recv()
        except (EOFError, OSError):
            raise self.died() from None
        return reply

    def cancel(self, number: int, seq: int) -> None:
        """Ask the worker to stop inference ``seq`` of request ``number`` (any thread)."""
        self._send(("cancel", number, seq))

    def read_property(self, name: str) -> Any:
        """Read property ``name`` of the compiled model in the worker, now.

        Raises:
            InferenceError: the worker has died or was stopped.
            AioinferError: the worker's error reading it (same class).
        """
        if self._death is not None:
            raise self._death
        with self._control_lock:
            try:
                assert self._control is not None
                self._control.send(("property", name))
                reply = self._control.recv()
            except (EOFError, OSError):
                raise self.died() from None
        if reply[0] == "error":
            raise worker.error_from(reply)
        return reply[1]

    def died(self) -> InferenceError:
        """The error of every inference once the worker has died (made once)."""
        with self._death_lock:
            if self._death is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=1.0)
                self._death = InferenceError(
                    f"the {self.device_name} worker process (pid {self.pid}) exited with code "
                    f"{self.process.returncode}; compile the model again to run it"
                )
            return self._death

    # -- lifetime -------------------------------------------------------------------------

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Ask the worker to exit, wait up to ``timeout`` seconds, then terminate it;
        close the connections. Idempotent; blocks (run it on a thread from async code)."""
        if self._stopped:
            return
        self._stopped = True
        self.abandon()
        for stop in (None, self.process.terminate, self.process.kill):
            if stop is not None:
                stop()
            try:
                self.process.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                timeout = 1.0

    def abandon(self) -> None:
        """Ask the worker to exit and close the connections, without waiting (the worker
        also exits when it reads the end of the control connection)."""
        self._send(("close",))
        with self._control_lock:
            if self._control is not None:
                self._control.close()
        for connection in list(self._connections):
            connection.close()

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._control_lock:
            if self._control is None:
                return
            with contextlib.suppress(OSError):  # dead or stopped: nothing runs there
                self._control.send(message)


def _blocking(connection: Connection) -> None:
    """Put ``connection`` back in blocking mode: an event loop that watched it for
    readability may have made it non-blocking (uvloop does), and a message that has only
    partly arrived would then fail to read (``BlockingIOError``) instead of completing.
    A reply is read once it starts to arrive, so the rest follows at once."""
    os.set_blocking(connection.fileno(), True)
