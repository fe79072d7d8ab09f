"""The PROCESS device's infer request: it sends its inputs to the worker process on a
connection of its own, and the event loop waits for the reply on that connection."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import anyio

from aioinfer.devices.process.supervisor import CONNECT_ATTEMPTS, Link
from aioinfer.devices.process.worker import error_from
from aioinfer.errors import AioinferError, InferCancelledError
from aioinfer.plugin.sync_request import SyncInferRequest

if TYPE_CHECKING:
    from aioinfer.devices.process.plugin import ProcessCompiledModel


class ProcessInferRequest(SyncInferRequest):
    """One infer request of a PROCESS compiled model, with its own worker connection.

    Stages: ``infer_preprocess`` validates the inputs here, in the application's process
    (base class), before anything is sent; :meth:`start_async` sends them and
    :meth:`wait_async` awaits the reply, both on the event loop, which watches the
    connection like any socket (no thread of the application takes part, and a worker
    that stops reading or answering never blocks the loop); ``infer_postprocess``
    publishes the outputs (arrays made by unpickling: the caller owns them);
    ``queued_seconds`` is how long the inference waited in the worker for a stream. The
    synchronous path sends and waits in the calling thread (:meth:`start_pipeline`,
    :meth:`wait_pipeline`). :meth:`cancel` reaches the worker, whose compute stops at its
    next kernel.

    The connection is made by the first inference (its handshake on a thread), and
    again after the worker was replaced. An inference that could not reach a worker
    that had just died goes to the next one; one that the worker had received fails
    with the worker's ``death`` (:class:`WorkerDiedError`, :class:`WorkerTimeoutError`).
    """

    def __init__(self, compiled_model: ProcessCompiledModel) -> None:
        super().__init__(compiled_model)
        self._compiled = compiled_model
        self._supervisor = compiled_model.supervisor
        self._link: Link | None = None
        self._lock = threading.Lock()
        self._sent: int | None = None
        """The number of the inference sent and not yet answered."""
        self._outputs: list[Any] = []

    # -- the event loop's path ------------------------------------------------------------

    async def start_async(self) -> None:
        """Send the inputs to the worker, waiting for a new worker while one starts.

        Raises:
            InferCancelledError: :meth:`cancel` was called before they were sent.
            DeviceUnavailableError: no worker could be reached (retryable).
            RequestClosedError: the compiled model was closed.
        """
        self._drop_interrupted()
        if self._sent is not None:  # a cancelled inference whose reply was not awaited
            await self._drain_async()
        error: AioinferError | None = None
        for _ in range(CONNECT_ATTEMPTS):
            link = self._link = await self._supervisor.link_async(self._link)
            message = self._message(link)
            try:
                await link.channel.send_async(message)
                return
            except OSError:  # the worker ended before the inference reached it
                self._unlink()
                self._raise_if_cancelled()  # or cancel() interrupted the connection
                error = await self._supervisor.death_of_async(link.handle)
            except BaseException:
                if link.channel.torn:  # half sent: the connection cannot be reused
                    self._unlink()
                raise
        assert error is not None
        raise error

    async def wait_async(self) -> None:
        """Await the worker's reply on the event loop.

        Cancelling the awaiting task (a deadline, a client gone) tells the worker to
        stop the inference and hands control back at once, whatever the worker does: the
        reply it still owes is read and dropped by the next inference on this request
        (:meth:`start_async`), or never when the heartbeat replaces a hung worker first.
        :meth:`cancel` ends the wait at once too.

        Raises:
            InferCancelledError: the inference was cancelled (the worker stopped).
            InferenceError: a kernel failed (the worker's message, naming the node).
            WorkerDiedError, WorkerTimeoutError: the worker died, or stopped answering
                and was killed, before it answered (retryable: a new worker starts).
        """
        link = self._link
        assert link is not None
        try:
            reply = await link.channel.receive_async()
        except anyio.get_cancelled_exc_class():
            self._stop(interrupt=False)  # the connection stays: its reply is drained later
            raise
        except (EOFError, OSError):
            self._unlink()
            raise await self._lost_async(link) from None
        self._take(reply)

    async def _drain_async(self) -> None:
        """Read and drop the reply of the inference sent last (it was cancelled)."""
        link = self._link
        assert link is not None
        try:
            await link.channel.receive_async()
        except (EOFError, OSError):
            self._unlink()
            return
        except BaseException:
            if link.channel.torn:
                self._unlink()
            raise
        with self._lock:
            self._sent = None

    async def _lost_async(self, link: Link) -> AioinferError:
        if self.cancel_token.requested:
            return InferCancelledError("the inference was cancelled")
        return await self._supervisor.death_of_async(link.handle)

    # -- the synchronous path -------------------------------------------------------------

    def start_pipeline(self) -> None:
        """Send the inputs to the worker, blocking the calling thread (the synchronous
        path); raises as :meth:`start_async`."""
        self._drop_interrupted()
        if self._sent is not None:
            self._drain()
        error: AioinferError | None = None
        for _ in range(CONNECT_ATTEMPTS):
            link = self._link = self._supervisor.link(self._link)
            try:
                link.channel.send(self._message(link))
                return
            except OSError:
                self._unlink()
                self._raise_if_cancelled()
                error = self._supervisor.death_of(link.handle)
        assert error is not None
        raise error

    def wait_pipeline(self) -> None:
        """Block until the worker's reply arrives (the synchronous path); raises as
        :meth:`wait_async`."""
        link = self._link
        assert link is not None
        try:
            reply = link.channel.receive()
        except (EOFError, OSError):
            self._unlink()
            self._raise_if_cancelled()
            raise self._supervisor.death_of(link.handle) from None
        self._take(reply)

    def _drain(self) -> None:
        link = self._link
        assert link is not None
        try:
            link.channel.receive()
        except (EOFError, OSError):
            self._unlink()
            return
        with self._lock:
            self._sent = None

    # -- both -----------------------------------------------------------------------------

    def _message(self, link: Link) -> tuple[int, list[Any]]:
        """Number the inference on ``link``: the message that sends it."""
        with self._lock:
            if self.cancel_token.requested:
                raise InferCancelledError("the inference was cancelled")
            self._sent = next(link.seqs)
            return self._sent, self.input_tensors

    def _raise_if_cancelled(self) -> None:
        if self.cancel_token.requested:
            raise InferCancelledError("the inference was cancelled") from None

    def _drop_interrupted(self) -> None:
        """Close the connection that :meth:`cancel` interrupted."""
        link = self._link
        if link is not None and link.channel.interrupted:
            self._unlink()

    def _unlink(self) -> None:
        """Drop the connection (its worker ended, or a message on it was cut)."""
        with self._lock:
            link, self._link, self._sent = self._link, None, None
        if link is not None:
            link.channel.close()

    def _take(self, reply: tuple[Any, ...]) -> None:
        with self._lock:
            self._sent = None
        if reply[0] == "cancelled":
            raise InferCancelledError("the inference was cancelled")
        if reply[0] == "error":
            raise error_from(reply)
        _, self._outputs, self.node_profile.timings, self.queued_seconds, live = reply
        self._compiled.record_live_properties(live)

    def infer_postprocess(self) -> None:
        """Publish the outputs received from the worker."""
        outputs, self._outputs = self._outputs, []
        self.set_results(outputs)

    def cancel(self) -> None:
        """Stop the running inference, from any thread: the worker is told (its compute
        stops at its next kernel), and the wait for its reply ends at once whatever the
        worker does (stopped, hung): the request's connection is interrupted, and the
        next inference makes a new one."""
        self._stop(interrupt=True)

    def _stop(self, interrupt: bool) -> None:
        super().cancel()
        with self._lock:
            link = self._link
            if self._sent is not None and link is not None:
                link.handle.cancel(link.number, self._sent)
                if interrupt:
                    link.channel.interrupt()
