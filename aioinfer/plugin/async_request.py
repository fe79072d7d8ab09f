"""AsyncInferRequest: the generic awaitable request that runs a device's stage pipeline."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aioinfer.plugin.sync_request import STAGES, Inputs

if TYPE_CHECKING:
    from aioinfer.model import Port
    from aioinfer.plugin.executors import Executor
    from aioinfer.plugin.sync_request import SyncInferRequest
    from aioinfer.results import InferResults

Stage = Callable[[], None]


class AsyncInferRequest:
    """One infer request: ``await request.infer(inputs)``.

    Runs the device's (executor, stage) pipeline in order; each stage is awaited on its
    executor, so compute happens on worker threads while the event loop stays free.
    """

    def __init__(self, request: SyncInferRequest, pipeline: Sequence[tuple[Executor, Stage]]):
        self._request = request
        self._pipeline = list(pipeline)
        self._names = _stage_names(self._pipeline)

    @property
    def compiled_model(self) -> Any:
        """The compiled model this request belongs to."""
        return self._request.compiled_model

    @property
    def inputs(self) -> list[Port]:
        """The input ports."""
        return self._request.compiled_model.inputs

    @property
    def outputs(self) -> list[Port]:
        """The output ports."""
        return self._request.compiled_model.outputs

    async def infer(self, inputs: Inputs | None = None) -> InferResults:
        """Run one inference and return its results.

        ``inputs`` is a dict from input name (or index, or Port) to array, or a list in
        input order; inputs set before with :meth:`set_tensor` may be left out.

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: bad
                input (nothing runs; the request stays usable).
            InferenceError: a kernel failed (the message names the node).
        """
        self._request.set_inputs(inputs)
        await self._run_pipeline()
        results = self._request.results
        assert results is not None
        return results

    async def _run_pipeline(self) -> None:
        request = self._request
        for name, (executor, stage) in zip(self._names, self._pipeline):
            start = time.perf_counter()
            try:
                await executor.run(stage, request.cancel)
            finally:
                request.stage_durations[name] = time.perf_counter() - start

    def infer_sync(self, inputs: Inputs | None = None) -> InferResults:
        """Run one inference in the calling thread, through the same stages (for scripts,
        tests and the ONNX backend API; never call it on an event loop)."""
        return self._request.infer(inputs)

    # -- tensors --------------------------------------------------------------------------

    def set_tensor(self, key: str | int | Port, value: Any) -> None:
        """Set one input for the next inference (see SyncInferRequest.set_tensor)."""
        self._request.set_tensor(key, value)

    def set_tensors(self, key: str | int | Port, values: Sequence[Any]) -> None:
        """Set one input from a list of tensors joined along the batch axis."""
        self._request.set_tensors(key, values)

    def get_tensor(self, key: str | int | Port) -> Any:
        """The input set for ``key`` or the output ``key`` of the last inference."""
        return self._request.get_tensor(key)

    @property
    def results(self) -> InferResults | None:
        """The results of the last completed inference."""
        return self._request.results

    def get_profiling_info(self) -> list[dict[str, Any]]:
        """Per-stage durations of the last inference."""
        return self._request.get_profiling_info()


def _stage_names(pipeline: Sequence[tuple[Executor, Stage]]) -> list[str]:
    if len(pipeline) == len(STAGES):
        return list(STAGES)
    return [getattr(stage, "__name__", f"stage{i}") for i, (_, stage) in enumerate(pipeline)]
