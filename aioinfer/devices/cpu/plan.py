"""The plan: a flat list of bound kernels over numbered slots, and the loop that runs it."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter, sleep
from typing import TYPE_CHECKING, Any

import numpy as np

from aioinfer.errors import InferCancelledError, InferenceError
from aioinfer.plugin.sync_request import CancelToken

if TYPE_CHECKING:  # kernel modules import this one (control flow runs sub-plans)
    from aioinfer.devices.cpu.kernels.registry import Kernel, OutKernel

GIL_YIELD_SECONDS = 0.0005
"""The compute thread offers the GIL at least this often, so the event loop's thread
never waits the interpreter's whole switch interval (5 ms) for it. A plan running in the
main thread (``infer_sync`` in a script) does not: no loop there waits for it, and on a
busy machine each offer (``sleep(0)``) can hand the core to another process for
milliseconds."""

_running = threading.local()
"""``token``: the CancelToken of the plan running on this thread (None outside a plan)."""


def current_cancel_token() -> CancelToken:
    """The cancel token of the plan running on this thread, so that a control-flow
    kernel's sub-plans stop with their parent; a fresh token outside any plan."""
    token = getattr(_running, "token", None)
    return token if token is not None else CancelToken()


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
    out_kernel: OutKernel | None = None
    """The kernel's out form (see :func:`~aioinfer.devices.cpu.kernels.registry.out_kernel`),
    which the memory planner binds to a buffer of the request; None without one."""


Observer = Callable[[Step, Sequence[Any], float], None]
"""Called after each step with the step, its outputs and its duration in seconds
(profiling, and the recording run of the memory planner)."""


@dataclass(frozen=True)
class Plan:
    """A compiled graph: constants in their slots, then steps in topological order."""

    num_slots: int
    constants: tuple[tuple[int, np.ndarray], ...]
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    steps: tuple[Step, ...]
    variables: tuple[str, ...] = ()
    """The state variables (make-stateful): the last ``len(variables)`` inputs are their
    current values, the last ``len(variables)`` outputs their values after the step."""

    def initial_slots(self) -> list[Any]:
        """A fresh slot list with the shared constants in place."""
        return list(self._initial_slots)

    @functools.cached_property
    def _initial_slots(self) -> tuple[Any, ...]:
        slots: list[Any] = [None] * self.num_slots
        for slot, array in self.constants:
            slots[slot] = array
        return tuple(slots)

    @functools.cached_property
    def kernels(self) -> tuple[Kernel, ...]:
        """The kernel of every step, in order (what :meth:`run` calls by default)."""
        return tuple(step.kernel for step in self.steps)

    def run(
        self,
        inputs: Sequence[np.ndarray],
        cancel: CancelToken,
        kernels: Sequence[Kernel] | None = None,
        observe: Observer | None = None,
    ) -> list[Any]:
        """Run every step; return the output values.

        ``kernels`` replaces the steps' kernels one for one (a request's memory plan binds
        out forms to its buffers); ``observe`` is called after every step. While it runs,
        ``cancel`` is this thread's :func:`current_cancel_token`.

        Raises:
            InferCancelledError: ``cancel.requested`` was set; checked before each kernel.
            InferenceError: a kernel raised; the message names the node.
        """
        previous = getattr(_running, "token", None)
        _running.token = cancel
        try:
            return self._run_steps(inputs, cancel, kernels or self.kernels, observe)
        finally:
            _running.token = previous

    def _run_steps(
        self,
        inputs: Sequence[np.ndarray],
        cancel: CancelToken,
        kernels: Sequence[Kernel],
        observe: Observer | None,
    ) -> list[Any]:
        slots = self.initial_slots()
        for slot, array in zip(self.input_slots, inputs):
            slots[slot] = array
        started = next_yield = perf_counter()
        next_yield += GIL_YIELD_SECONDS
        offer_gil = threading.current_thread() is not threading.main_thread()
        # Neither an observer nor GIL offers: no clock readings (the event loop's thread
        # runs short plans inline, see inline.py).
        timed = observe is not None or offer_gil
        for step, kernel in zip(self.steps, kernels):
            if cancel.requested:
                raise InferCancelledError("the inference was cancelled")
            try:
                produced = kernel(*[slots[i] for i in step.inputs])
            except InferCancelledError:
                raise  # a sub-plan of a control-flow kernel saw the cancellation
            except Exception as exc:
                raise InferenceError(
                    f"node {step.name!r} ({step.op_type}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            for slot, value in zip(step.outputs, produced):
                slots[slot] = value
            for slot in step.release:
                slots[slot] = None
            if not timed:
                continue
            now = perf_counter()
            if observe is not None:
                observe(step, produced, now - started)
            if offer_gil and now > next_yield:
                sleep(0)
                now = perf_counter()
                next_yield = now + GIL_YIELD_SECONDS
            started = now
        return [slots[i] for i in self.output_slots]
