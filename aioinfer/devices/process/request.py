"""The PROCESS device's infer request: it sends its inputs to the worker process on a
connection of its own, and the event loop waits for the reply on that connection."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

import anyio

from aioinfer.devices.process.worker import error_from
from aioinfer.errors import AioinferError, InferCancelledError
from aioinfer.plugin.sync_request import SyncInferRequest

if TYPE_CHECKING:
    from aioinfer.devices.process.plugin import ProcessCompiledModel


class ProcessInferRequest(SyncInferRequest):
    """One infer request of a PROCESS compiled model, with its own worker connection.

    Stages: ``infer_preprocess`` validates the inputs here, in the application's process
    (base class), before anything is sent; ``start_pipeline`` sends them (on the event
    loop); ``wait_async`` awaits the reply on the loop, which watches the connection like
    any socket, so no thread of the application takes part; ``infer_postprocess``
    publishes the outputs (arrays made by unpickling: the caller owns them);
    ``queued_seconds`` is how long the inference waited in the worker for a stream. The
    synchronous path waits with :meth:`wait_pipeline` instead. :meth:`cancel` reaches the
    worker, whose compute stops at its next kernel.
    """

    def __init__(self, compiled_model: ProcessCompiledModel) -> None:
        super().__init__(compiled_model)
        self._worker = compiled_model.worker
        self._number, self._connection = self._worker.connect()
        self._lock = threading.Lock()
        self._sent: int | None = None
        """The number of the inference sent and not yet answered."""
        self._outputs: list[Any] = []

    def start_pipeline(self) -> None:
        """Send the inputs to the worker.

        Raises:
            InferCancelledError: :meth:`cancel` was called before they were sent.
            InferenceError: the worker process has died (naming the device and its exit
                code).
        """
        if self._sent is not None:  # an inference cancelled between its stages
            self._take(self._worker.receive(self._connection), drain=True)
        with self._lock:
            if self.cancel_token.requested:
                raise InferCancelledError("the inference was cancelled")
            self._sent = self._worker.next_seq()
        self._worker.send(self._connection, self._sent, self._inputs)

    def wait_pipeline(self) -> None:
        """Block until the worker's reply arrives (the synchronous path).

        Raises:
            InferCancelledError: the inference was cancelled (the worker stopped).
            InferenceError: a kernel failed (the worker's message, naming the node), or
                the worker process has died.
        """
        self._take(self._worker.receive(self._connection))

    async def wait_async(self) -> None:
        """Await the worker's reply on the event loop; raises as :meth:`wait_pipeline`.

        Cancelling the awaiting task cancels the inference in the worker and waits
        (shielded) until the worker has answered, so that the connection is ready for the
        next inference.
        """
        try:
            await anyio.wait_readable(self._connection.fileno())
        except anyio.get_cancelled_exc_class():
            self.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(AioinferError, OSError):
                await anyio.wait_readable(self._connection.fileno())
                self._take(self._worker.receive(self._connection), drain=True)
            raise
        except OSError:  # the connection was closed: the worker was stopped
            raise self._worker.died() from None
        self.wait_pipeline()

    def _take(self, reply: tuple[Any, ...], drain: bool = False) -> None:
        with self._lock:
            self._sent = None
        if drain:
            return
        if reply[0] == "cancelled":
            raise InferCancelledError("the inference was cancelled")
        if reply[0] == "error":
            raise error_from(reply)
        _, self._outputs, self.node_profile.timings, self.queued_seconds = reply

    def infer_postprocess(self) -> None:
        """Publish the outputs received from the worker."""
        outputs, self._outputs = self._outputs, []
        self.set_results(outputs)

    def cancel(self) -> None:
        """Stop the running inference: in the worker when it was sent (any thread)."""
        super().cancel()
        with self._lock:
            if self._sent is not None:
                self._worker.cancel(self._number, self._sent)
