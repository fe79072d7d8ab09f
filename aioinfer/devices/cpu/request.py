"""The CPU device's infer request: the plan runs in ``start_pipeline`` on a task thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aioinfer.plugin.sync_request import SyncInferRequest

if TYPE_CHECKING:
    from aioinfer.devices.cpu.plugin import CPUCompiledModel


class CPUInferRequest(SyncInferRequest):
    """Runs the compiled plan over this request's inputs."""

    def __init__(self, compiled_model: CPUCompiledModel) -> None:
        super().__init__(compiled_model)
        self._plan = compiled_model.plan
        self._produced: list[Any] = []

    def start_pipeline(self) -> None:
        self._produced = self._plan.run(self._inputs, self.cancel_token)  # type: ignore[arg-type]

    def infer_postprocess(self) -> None:
        produced, self._produced = self._produced, []
        self.set_results([_owned(value, self._inputs) for value in produced])


def _owned(value: Any, inputs: list[np.ndarray | None]) -> np.ndarray:
    """``value`` as an array the user may keep: copied when it may alias shared memory
    (a weight, a user input, or a view into a buffer)."""
    array = np.asarray(value)
    if not array.flags.owndata or not array.flags.writeable or any(array is x for x in inputs):
        return array.copy()
    return array
