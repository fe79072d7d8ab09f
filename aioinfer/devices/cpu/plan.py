"""The plan: a flat list of bound kernels over numbered slots, and the loop that runs it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter, sleep
from typing import Any

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel
from aioinfer.errors import InferCancelledError, InferenceError
from aioinfer.plugin.sync_request import CancelToken

GIL_YIELD_SECONDS = 0.0005
"""The compute thread offers the GIL at least this often, so the event loop's thread
never waits the interpreter's whole switch interval (5 ms) for it."""

NONE_SLOT = 0
"""Always holds None: omitted optional inputs read it."""
SCRATCH_SLOT = 1
"""Receives outputs nobody reads."""


@dataclass(frozen=True)
class Step:
    """One kernel call: read ``inputs`` slots, write ``outputs`` slots, free ``release``."""

    kernel: Kernel
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    release: tuple[int, ...]
    name: str
    op_type: str
    execution_type: str = "native"


@dataclass(frozen=True)
class Plan:
    """A compiled graph: constants in their slots, then steps in topological order."""

    num_slots: int
    constants: tuple[tuple[int, np.ndarray], ...]
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    steps: tuple[Step, ...]

    def initial_slots(self) -> list[Any]:
        """A fresh slot list with the shared constants in place."""
        slots: list[Any] = [None] * self.num_slots
        for slot, array in self.constants:
            slots[slot] = array
        return slots

    def run(self, inputs: Sequence[np.ndarray], cancel: CancelToken) -> list[Any]:
        """Run every step; return the output values.

        Raises:
            InferCancelledError: ``cancel.requested`` was set; checked before each kernel.
            InferenceError: a kernel raised; the message names the node.
        """
        slots = self.initial_slots()
        for slot, array in zip(self.input_slots, inputs):
            slots[slot] = array
        next_yield = perf_counter() + GIL_YIELD_SECONDS
        for step in self.steps:
            if cancel.requested:
                raise InferCancelledError("the inference was cancelled")
            try:
                produced = step.kernel(*[slots[i] for i in step.inputs])
            except Exception as exc:
                raise InferenceError(
                    f"node {step.name!r} ({step.op_type}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            for slot, value in zip(step.outputs, produced):
                slots[slot] = value
            for slot in step.release:
                slots[slot] = None
            now = perf_counter()
            if now > next_yield:
                sleep(0)
                next_yield = now + GIL_YIELD_SECONDS
        return [slots[i] for i in self.output_slots]
