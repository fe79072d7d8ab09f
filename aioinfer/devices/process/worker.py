"""The worker process of the PROCESS device: compiles the model on the target device and
serves inferences: a thread per connection of the parent, a compute thread per stream.

The parent starts it with ``python -m aioinfer.devices.process`` (a fresh interpreter
that does not import the application's ``__main__``), writes an authentication key to
its stdin and reads the address it listens on from its stdout. Protocol (pickled tuples
over authenticated local sockets, framed by :mod:`aioinfer.devices.process.channel`):

- control connection, parent to worker: ``("compile", payload)`` once, then any of
  ``("ping",)``, ``("cancel", request number, seq)`` and ``("close",)``; worker to
  parent: ``("pong",)`` per ping (answered by the main thread, also while the model
  compiles or computes: the parent's heartbeat), and once the compile's ``("ok",
  description)`` or ``("error", class name, message)``.
- one connection per infer request of the parent, which first sends its number, then
  ``(seq, inputs)`` per inference; worker to parent: ``("ok", outputs, node timings,
  seconds waited for a stream, live properties)``, ``("cancelled",)`` or ``("error",
  class name, message)``. Each inference computes on one of the target's NUM_STREAMS
  requests (it waits while all are busy).

The worker exits on ``"close"`` and when the control connection reaches its end (the
parent closed it or died).
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Listener
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

import aioinfer.errors
from aioinfer.devices.process.channel import Channel
from aioinfer.errors import AioinferError, InferCancelledError
from aioinfer.model import Model

if TYPE_CHECKING:
    from aioinfer.plugin.compiled_model import CompiledModel
    from aioinfer.plugin.sync_request import SyncInferRequest

Reply = tuple[Any, ...]


def error_reply(exc: BaseException, default: str) -> Reply:
    """The reply that carries ``exc`` to the parent: an aioinfer error keeps its class,
    anything else becomes ``default`` (an aioinfer class name) naming its type."""
    if isinstance(exc, AioinferError):
        return ("error", type(exc).__name__, str(exc))
    return ("error", default, f"{type(exc).__name__}: {exc}")


def error_from(reply: Reply) -> AioinferError:
    """The exception an ``("error", class name, message)`` reply stands for, of the same
    aioinfer class as in the worker."""
    _, name, message = reply
    cls = getattr(aioinfer.errors, name, None)
    if isinstance(cls, type) and issubclass(cls, AioinferError):
        return cls(message)
    return AioinferError(f"{name}: {message}")


CompileModel = Callable[[Model, str, dict[str, Any]], "CompiledModel"]
"""How the worker compiles: ``(model, target device, config) -> compiled model``, as a
Core compiles on the target device, never auto-batched. The worker's program
(``__main__``) hands it over, so that the device's modules do not import the Core."""


def compile_in_worker(payload: dict[str, Any], compile_model: CompileModel) -> CompiledModel:
    """Compile the model of ``payload`` on its target device with ``compile_model``."""
    proto = onnx.ModelProto()
    proto.ParseFromString(payload["model"])
    ir_model = ir.serde.deserialize_model(proto)
    if payload["base_dir"]:
        ir.external_data.set_base_dir(ir_model.graph, payload["base_dir"])
    return compile_model(Model(ir_model), payload["target"], payload["config"])


def describe(compiled: CompiledModel) -> dict[str, Any]:
    """What the parent needs of a compiled model: ports, streams, config, and the value of
    every readable property (those that cannot be read now are left out)."""
    properties: dict[str, Any] = {}
    for name in compiled.supported_properties():
        try:
            properties[name] = compiled.get_property(name)
        except AioinferError:
            continue
    return {
        "name": compiled.name,
        "inputs": compiled.inputs,
        "outputs": compiled.outputs,
        "streams": compiled.streams,
        "config": compiled.config,
        "properties": properties,
    }


def live_properties(compiled: CompiledModel) -> list[str]:
    """The readable properties of ``compiled`` whose values change while it runs: those
    its device declares read-only and mutable (``ACTIVATION_MEMORY_BYTES``)."""
    declared = compiled.plugin.properties
    return [
        name
        for name in compiled.supported_properties()
        if name in declared and declared[name].mutable and not declared[name].configurable
    ]


class Job:
    """One inference handed from a connection's thread to a stream's compute thread."""

    __slots__ = ("done", "inputs", "reply", "seq", "server", "submitted")

    def __init__(self, server: ConnectionServer, seq: int, inputs: list[Any]) -> None:
        self.server = server
        self.seq = seq
        self.inputs = inputs
        self.reply: Reply = ("cancelled",)
        self.submitted = time.perf_counter()
        self.done = threading.Lock()
        self.done.acquire()  # released when the reply is ready


class Streams:
    """One compute thread per stream of the compiled model, each with its own infer
    request, taking jobs from one queue in arrival order.

    A stream's thread goes from one inference to the next without sleeping while jobs
    are queued: under load the compute never waits for a thread to wake up, and it
    stays on one thread (one core's caches, one set of BLAS buffers).
    """

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled
        self.live_properties = live_properties(compiled)
        """Read-only properties that change while the model runs: each reply carries them."""
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        for index in range(compiled.streams):
            request = compiled.create_sync_infer_request()
            threading.Thread(
                target=self._compute,
                args=(request,),
                name=f"aioinfer-stream-{index}",
                daemon=True,
            ).start()

    def run(self, job: Job) -> Reply:
        """Queue ``job`` and wait for its reply."""
        self.jobs.put(job)
        job.done.acquire()
        return job.reply

    def _compute(self, request: SyncInferRequest) -> None:
        while True:
            job = self.jobs.get()
            waited = time.perf_counter() - job.submitted
            try:
                job.reply = job.server.run(request, job.seq, job.inputs, waited)
            finally:
                job.done.release()


class ConnectionServer:
    """Serves one connection (one infer request of the parent) on a thread of its own;
    its inferences compute on the streams' threads, so at most NUM_STREAMS compute at
    once.

    Inferences are numbered (``seq``) by the parent; a cancel names the inference it
    means, so that one arriving late never stops the next inference, and one arriving
    before its inference stops it as soon as it starts.
    """

    def __init__(self, streams: Streams, channel: Channel) -> None:
        self.streams = streams
        self.channel = channel
        self._lock = threading.Lock()
        self._request: SyncInferRequest | None = None
        self._current = -1
        self._cancelled = -1

    def cancel(self, seq: int) -> None:
        """Stop inference ``seq`` (now, or as soon as it starts); called by the control
        thread."""
        with self._lock:
            self._cancelled = max(self._cancelled, seq)
            if self._current == seq and self._request is not None:
                self._request.cancel()

    def serve(self) -> None:
        """Answer inferences until the connection ends."""
        try:
            while True:
                seq, inputs = self.channel.receive()
                self.channel.send(self.streams.run(Job(self, seq, inputs)))
        except (EOFError, OSError):
            return
        finally:
            self.channel.close()

    def run(self, request: SyncInferRequest, seq: int, inputs: list[Any], waited: float) -> Reply:
        """Run one inference on a stream's ``request``, through its four stages (on the
        stream's thread); ``waited`` is the time it waited for the stream."""
        try:
            request.set_inputs(inputs, share_inputs=True)  # just unpickled: ours alone
            with self._lock:
                self._request, self._current = request, seq
                request.cancel_token.requested = self._cancelled >= seq
            try:
                results = request.run_stages()  # keeps a cancel that came before it
            finally:
                with self._lock:
                    self._request, self._current = None, -1
            timings = list(request.node_profile.timings)
            compiled = self.streams.compiled
            live = {name: compiled.get_property(name) for name in self.streams.live_properties}
            return ("ok", list(results.to_tuple()), timings, waited, live)
        except InferCancelledError:
            return ("cancelled",)
        except Exception as exc:
            return error_reply(exc, "InferenceError")
        finally:
            request.clear_inputs()


def main(compile_model: CompileModel) -> None:
    """The worker process (``python -m aioinfer.devices.process``), compiling with
    ``compile_model``.

    Reads the authentication key (hex) from stdin, listens on a local socket and writes
    its address to stdout. The first connection is the control connection, on which the
    model arrives; it compiles on a thread while the main thread answers the control
    connection. After the compile, each connection is one infer request of the parent
    (it first sends its number). The worker serves until ``"close"`` or the end of the
    control connection (the parent closed it or died). Ctrl-C in a terminal reaches the
    whole process group; the worker ignores it and lets the parent decide when it ends.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connected = threading.Event()
    threading.Thread(
        target=_exit_when_orphaned, args=(os.getppid(), connected), daemon=True
    ).start()
    authkey = bytes.fromhex(sys.stdin.readline().strip())
    if not authkey:  # the parent died before it wrote the key
        return
    listener = Listener(authkey=authkey, backlog=64)
    try:
        sys.stdout.write(f"{listener.address}\n")
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads stdout any more
        control = Channel(listener.accept())
    except (EOFError, OSError, AuthenticationError):  # the parent gave up or died
        return
    connected.set()
    Control(control, listener, compile_model).serve()


def _exit_when_orphaned(parent: int, connected: threading.Event) -> None:
    """Until the control connection is made (whose end then tells the worker that the
    parent is gone), exit when the parent dies: it may die between starting the worker
    and connecting to it, leaving the worker waiting for a connection forever."""
    while not connected.wait(0.5):
        if os.getppid() != parent:
            os._exit(0)


class Control:
    """The control connection's end in the worker: compiles, answers heartbeats, passes
    cancels on, and ends the worker."""

    def __init__(self, channel: Channel, listener: Listener, compile_model: CompileModel) -> None:
        self.channel = channel
        self.listener = listener
        self.compile_model = compile_model
        self.servers: dict[int, ConnectionServer] = {}
        self._send_lock = threading.Lock()

    def serve(self) -> None:
        """Answer the control connection (on the main thread) until ``"close"`` or its
        end."""
        while True:
            try:
                message = self.channel.receive()
            except (EOFError, OSError):
                return
            if message[0] == "ping":
                self.reply(("pong",))
            elif message[0] == "cancel":
                server = self.servers.get(message[1])
                if server is not None:
                    server.cancel(message[2])
            elif message[0] == "compile":
                threading.Thread(
                    target=self.compile, args=(message[1],), name="aioinfer-compile", daemon=True
                ).start()
            else:  # "close"
                return

    def reply(self, message: Reply) -> None:
        with self._send_lock:
            self.channel.send(message)

    def compile(self, payload: dict[str, Any]) -> None:
        """Compile, start the streams and accept the infer requests' connections; reply."""
        try:
            compiled = compile_in_worker(payload, self.compile_model)
            info = describe(compiled)
        except Exception as exc:
            self.reply(error_reply(exc, "CompileError"))
            return
        streams = Streams(compiled)
        threading.Thread(
            target=self.accept, args=(streams,), name="aioinfer-accept", daemon=True
        ).start()
        self.reply(("ok", info))

    def accept(self, streams: Streams) -> None:
        """Accept the connections of the parent's infer requests, one thread each."""
        while True:
            try:
                channel = Channel(self.listener.accept())
                number = channel.receive()
            except (EOFError, OSError, AuthenticationError):
                continue
            server = self.servers[number] = ConnectionServer(streams, channel)

            def serve(server: ConnectionServer = server, number: int = number) -> None:
                server.serve()
                self.servers.pop(number, None)

            threading.Thread(target=serve, name=f"aioinfer-request-{number}", daemon=True).start()
