"""The ``TWOSTAGE`` infer request: its four stages over the request's own buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aioinfer.errors import InferCancelledError
from aioinfer.plugin import SyncInferRequest

if TYPE_CHECKING:
    from aioinfer_twostage.plugin import TwoStageCompiledModel


class TwoStageInferRequest(SyncInferRequest):
    """Stages inputs into device buffers (host thread), computes (compute thread), and
    copies the outputs back to host memory (host thread).

    The stage methods are the plugin API's: ``infer_preprocess``, ``start_pipeline``,
    ``wait_pipeline`` and ``infer_postprocess``; the compiled model's ``pipeline()`` says
    on which executor each runs. ``infer_sync`` runs the same four in the calling thread.
    """

    def __init__(self, compiled_model: TwoStageCompiledModel) -> None:
        super().__init__(compiled_model)
        self._plan = compiled_model.plan
        # The "device memory" of this request: reused while the input shapes stay the same.
        self._device_inputs: list[Any] = [None] * len(compiled_model.inputs)
        self._device_outputs: list[Any] = []

    def infer_preprocess(self) -> None:
        """Check the inputs (base class), then copy them into this request's buffers."""
        super().infer_preprocess()
        for index, value in enumerate(self.input_tensors):
            # Every stage on a thread checks the token between units of work.
            if self.cancel_token.requested:
                raise InferCancelledError("the inference was cancelled")
            self._device_inputs[index] = self._stage(index, value)

    def _stage(self, index: int, value: Any) -> Any:
        if not isinstance(value, np.ndarray):  # a sequence or an empty optional
            return value
        buffer = self._device_inputs[index]
        if not isinstance(buffer, np.ndarray) or buffer.shape != value.shape:
            buffer = np.empty(value.shape, value.dtype)
        np.copyto(buffer, value)
        return buffer

    def start_pipeline(self) -> None:
        """Run the plan over the staged inputs; it checks the cancel token between kernels
        and raises ``InferCancelledError`` when it is set."""
        self._device_outputs = self._plan.run(self._device_inputs, self.cancel_token)

    def infer_postprocess(self) -> None:
        """Copy every output to fresh host memory and publish the results."""
        produced, self._device_outputs = self._device_outputs, []
        self.set_results([_download(value) for value in produced])


def _download(value: Any) -> Any:
    """A copy the user owns: a later inference never writes into it."""
    if isinstance(value, list):
        return [_download(item) for item in value]
    return None if value is None else np.array(value, copy=True)
