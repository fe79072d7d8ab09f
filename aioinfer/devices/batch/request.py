"""The BATCH device's infer request: its stages hand its rows to the batcher."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.sync_request import SyncInferRequest

if TYPE_CHECKING:
    from aioinfer.devices.batch.batcher import BatchItem
    from aioinfer.devices.batch.plugin import BatchCompiledModel


class BatchInferRequest(SyncInferRequest):
    """One inference of a BATCH compiled model.

    Stages: ``infer_preprocess`` validates this request's inputs on their own (a bad input
    fails here, before any batch sees it); ``enqueue`` hands them to the batcher;
    ``wait_batch`` awaits the batch; ``infer_postprocess`` publishes this request's rows.
    The synchronous path (``infer_sync``) runs the inputs alone on the target device.
    """

    def __init__(self, compiled_model: BatchCompiledModel) -> None:
        super().__init__(compiled_model)
        self._batcher = compiled_model.batcher
        self._target = compiled_model.target
        self._item: BatchItem | None = None
        self._outputs: list[np.ndarray] = []
        self._alone: SyncInferRequest | None = None
        self._item_done: BatchItem | None = None
        """The batch item of the last inference that went through the batcher."""

    def enqueue(self) -> None:
        """Join the batch queue with this inference's inputs (runs on the loop)."""
        self._item = self._batcher.submit(self.input_tensors, member=True)

    async def wait_batch(self) -> None:
        """Wait until the batch holding this inference's rows has run.

        Cancelling the awaiting task takes the rows out of the queue, or out of their
        running batch, without touching the other inferences.

        Raises:
            InferCancelledError: :meth:`cancel` was called meanwhile.
            InferenceError: the target device failed on these inputs.
        """
        item = self._item
        assert item is not None
        try:
            await item.done.wait()
        except anyio.get_cancelled_exc_class():
            self._batcher.withdraw(item)
            raise
        self._item_done = item
        self.queued_seconds = item.dispatched - item.enqueued
        if item.error is not None:
            raise item.error
        assert item.outputs is not None
        self._outputs = item.outputs

    def start_pipeline(self) -> None:
        """The synchronous path: run this inference alone on the target device."""
        if self._alone is None:
            self._alone = self._target.create_sync_infer_request()
        self._outputs = list(self._alone.infer(self.input_tensors, share_inputs=True).to_tuple())
        self._item_done = None
        self.queued_seconds = 0.0

    def infer_postprocess(self) -> None:
        outputs, self._outputs = self._outputs, []
        self._item = None
        self.set_results(outputs)

    def cancel(self) -> None:
        """Stop this inference: withdraw its rows from the batcher (from any thread)."""
        super().cancel()
        if self._item is not None:
            self._batcher.cancel(self._item)
        if self._alone is not None:
            self._alone.cancel()

    def get_profiling_info(self) -> list[dict[str, Any]]:
        """Stage durations, plus a ``"batch"`` entry: seconds queued before the batch
        started, its rows and its number of inferences."""
        info = super().get_profiling_info()
        item = self._item_done
        if item is not None:
            info.append(
                {
                    "name": "batch",
                    "type": "batch",
                    "seconds": self.queued_seconds,
                    "rows": item.batch_rows,
                    "requests": item.batch_size,
                }
            )
        return info


class BatchAsyncInferRequest(AsyncInferRequest):
    """The awaitable request of a BATCH model: one of the batcher's members (the requests
    whose next inference may join a batch) until it is closed."""

    async def close(self) -> None:
        """Close the request (see :meth:`AsyncInferRequest.close`); the batcher stops
        waiting for it."""
        await super().close()
        self.compiled_model.batcher.remove_member(self)
