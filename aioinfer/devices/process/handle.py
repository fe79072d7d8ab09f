"""The parent's side of one PROCESS worker: start it, watch it, connect to it, stop it.

A *monitor* thread per worker owns the reading end of the control connection. It sends a
heartbeat (``"ping"``) every second or so and kills the worker when one is not answered
within ``WORKER_TIMEOUT_S``: a worker that was stopped (SIGSTOP), deadlocked or swapped
out is replaced instead of holding its inferences forever. A heartbeat, rather than a
deadline on each inference, tells a hung worker from a long inference: the worker's
main thread answers while its streams compute. The monitor also sees the worker die
(the control connection ends), reaps it and records why, then tells its owner, which
starts a new worker (see :mod:`aioinfer.devices.process.supervisor`). Nothing here runs
on an event loop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

from aioinfer.devices.process import worker
from aioinfer.devices.process.channel import INCOMPLETE, Channel
from aioinfer.errors import (
    CompileError,
    DeviceUnavailableError,
    WorkerDiedError,
    WorkerTimeoutError,
)

STOP_TIMEOUT_SECONDS = 5.0
"""How long ``stop`` waits for the worker to exit after asking it to, before it kills
it; also how long a request that saw its connection end waits for the monitor to
record the worker's death."""

START_TIMEOUT_SECONDS = 120.0
"""How long a new worker may take to start Python and listen (about a second when the
machine is idle); past that it is killed. The compile that follows is bounded by the
heartbeat, which the worker answers while it compiles."""

PING_INTERVAL_SECONDS = 1.0
"""The time between heartbeats (a quarter of ``WORKER_TIMEOUT_S`` when that is less)."""


class WorkerHandle:
    """A running worker process: its control connection, watched by a monitor thread,
    and the connections of the parent's infer requests (made by :meth:`connect`).

    Attributes:
        death: None while the worker runs; once the monitor has reaped it, the error of
            the inferences it did not finish (:class:`WorkerDiedError` or
            :class:`WorkerTimeoutError`, naming the device, pid and exit status).
    """

    def __init__(
        self,
        device_name: str,
        process: subprocess.Popen[bytes],
        timeout: float,
        on_exit: Callable[[WorkerHandle], None],
    ) -> None:
        self.device_name = device_name
        self.process = process
        """The worker process (``process.pid``, ``process.returncode``)."""
        self.timeout = timeout
        self.death: DeviceUnavailableError | None = None
        self._on_exit = on_exit
        self._address: Any = None
        self._authkey = os.urandom(32)
        self._control: Channel | None = None
        self._send_lock = threading.Lock()
        self._numbers = itertools.count()
        self._compiled: concurrent.futures.Future[tuple[Any, ...]] = concurrent.futures.Future()
        self._killed_because: str | None = None
        self._hung = False

    @classmethod
    def start(
        cls,
        device_name: str,
        payload: dict[str, Any],
        timeout: float,
        on_exit: Callable[[WorkerHandle], None],
    ) -> tuple[WorkerHandle, dict[str, Any]]:
        """Start a worker and have it compile ``payload``; return the handle and the
        worker's description of the compiled model (see
        :func:`aioinfer.devices.process.worker.describe`). Blocks (about a second and a
        half); ``on_exit(handle)`` is called on the monitor thread once the worker has
        ended and :attr:`death` is set.

        Raises:
            AioinferError: the compile failed in the worker (its class and message).
            CompileError: the worker died, stopped answering, or could not be reached
                while starting or compiling.
        """
        # The worker imports this aioinfer, wherever it was imported from.
        root = str(Path(__file__).resolve().parents[3])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "aioinfer.devices.process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        handle = cls(device_name, process, timeout, on_exit)
        watchdog = threading.Timer(START_TIMEOUT_SECONDS, handle.kill, ("did not start",))
        watchdog.daemon = True
        watchdog.start()
        try:
            assert process.stdin is not None and process.stdout is not None
            with process.stdin:
                process.stdin.write(handle._authkey.hex().encode() + b"\n")
            with process.stdout:
                handle._address = process.stdout.readline().decode().strip()
            if not handle._address:
                raise EOFError("the worker ended before it listened")
            control = Channel(Client(handle._address, authkey=handle._authkey))
        except (EOFError, OSError, AuthenticationError) as exc:
            process.kill()
            process.wait()
            raise CompileError(
                f"the {device_name} worker process (pid {process.pid}) "
                f"{exit_status(process.returncode)} while starting "
                f"({type(exc).__name__}: {exc})"
            ) from None
        finally:
            watchdog.cancel()
        os.set_blocking(control.fd, False)
        handle._control = control
        handle.send(("compile", payload))
        threading.Thread(
            target=handle._monitor, name=f"aioinfer-monitor-{process.pid}", daemon=True
        ).start()
        reply = handle._compiled.result()
        if reply[0] == "error":
            handle.stop()
            raise worker.error_from(reply)
        return handle, reply[1]

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    # -- talking to the worker ------------------------------------------------------------

    def connect(self) -> tuple[int, Channel]:
        """A new connection for one infer request, and its number (cancels name it).
        Blocks for the authentication handshake: from async code, run it on a thread.

        Raises:
            EOFError: the worker has died (or was stopped): wait for :attr:`death`.
        """
        if self.death is not None:
            raise EOFError("the worker has died")
        number = next(self._numbers)
        try:
            channel = Channel(Client(self._address, authkey=self._authkey))
            channel.send(number)
        except (EOFError, OSError, AuthenticationError):
            raise EOFError("the worker has died") from None
        os.set_blocking(channel.fd, False)
        return number, channel

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` on the control connection, from any thread, without blocking:
        what the socket cannot take now, the monitor writes when it can. A worker that has
        died gets nothing (nothing runs there)."""
        with self._send_lock:
            if self._control is None:
                return
            self._control.queue(message)
            with contextlib.suppress(OSError):  # dead: the monitor sees the end
                self._control.flush()

    def cancel(self, number: int, seq: int) -> None:
        """Ask the worker to stop inference ``seq`` of request ``number`` (any thread)."""
        self.send(("cancel", number, seq))

    # -- lifetime -------------------------------------------------------------------------

    def kill(self, reason: str) -> None:
        """Kill the worker (SIGKILL, which also ends a stopped process); ``reason`` (what
        it did, e.g. ``"did not start"``) goes into :attr:`death`. Any thread."""
        if self._killed_because is None:
            self._killed_because = reason
        with contextlib.suppress(OSError):
            self.process.kill()

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Ask the worker to exit, wait up to ``timeout`` seconds, then kill it. Blocks
        (run it on a thread from async code); idempotent."""
        self.send(("close",))
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill("did not exit when asked to")
            self.process.wait()

    def abandon(self) -> None:
        """Ask the worker to exit, without waiting (it also exits when the application's
        process ends: its control connection closes)."""
        self.send(("close",))

    def _monitor(self) -> None:
        """The monitor thread: heartbeats, control writes left over, replies, death."""
        control = self._control
        assert control is not None
        interval = min(PING_INTERVAL_SECONDS, self.timeout / 4)
        poller = select.poll()
        ping_sent: float | None = None
        next_ping = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if ping_sent is None and now >= next_ping:
                    self.send(("ping",))
                    ping_sent = now
                elif ping_sent is not None and now - ping_sent >= self.timeout:
                    self._hung = True
                    self.kill(
                        f"did not answer a heartbeat within {self.timeout:g} s (WORKER_TIMEOUT_S)"
                    )
                    break
                wake = next_ping if ping_sent is None else ping_sent + self.timeout
                with self._send_lock:
                    pending = control.pending
                poller.register(control.fd, select.POLLIN | (select.POLLOUT if pending else 0))
                poller.poll(max(0, math.ceil((wake - now) * 1000)))
                if pending:
                    with self._send_lock:
                        control.flush()
                while (message := control.read()) is not INCOMPLETE:
                    if message[0] == "pong":
                        ping_sent, next_ping = None, time.monotonic() + interval
                    else:  # the compile's reply
                        self._compiled.set_result(message)
        except (EOFError, OSError):
            pass  # the worker ended (or closed its end: it exits next)
        self._reap()

    def _reap(self) -> None:
        """Wait for the worker's end, record :attr:`death`, tell the owner."""
        try:
            self.process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill("closed its control connection and did not exit")
            self.process.wait()
        with self._send_lock:
            assert self._control is not None
            self._control.close()
            self._control = None
        what = f"the {self.device_name} worker process (pid {self.pid})"
        if self._killed_because is not None:
            what += f" {self._killed_because}: killed (exit code {self.process.returncode})"
        else:
            what += f" {exit_status(self.process.returncode)}"
        retry = "; the inference did not complete; a new worker is starting: retry the request"
        error = WorkerTimeoutError if self._hung else WorkerDiedError
        self.death = error(what + retry)
        if not self._compiled.done():
            self._compiled.set_exception(CompileError(f"{what} while compiling the model"))
        self._on_exit(self)


def exit_status(returncode: int | None) -> str:
    """How a process ended, in words: ``"was killed by SIGKILL (exit code -9)"``."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {returncode})"
    return f"exited with code {returncode}"
