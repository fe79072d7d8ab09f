"""The plan: a flat list of bound kernels over numbered slots, and the loop that runs it.

The loop is the per-kernel overhead of every inference, so each step is compiled once
into a tuple the loop unpacks (:class:`Call`): a one-input kernel is called with the
slot's value, a many-input one with an ``itemgetter`` over the slots, and a one-output
step stores its output without a ``zip``. Measured on a chain of small kernels, that
took the executor's own cost per step from about 390 ns to about 110 ns.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from aioinfer.errors import InferCancelledError, InferenceError
from aioinfer.plugin.sync_request import CancelToken

if TYPE_CHECKING:  # kernel modules import this one (control flow runs sub-plans)
    from aioinfer.devices.cpu.kernels.registry import Kernel, OutKernel

GIL_YIELD_SECONDS = 0.0005
"""The longest the event loop's thread should wait for the GIL while a plan computes on
another thread: the interpreter's switch interval that :func:`keep_loop_responsive` sets
(the default, 5 ms, is the wait otherwise).

A plan used to offer the GIL itself (``sleep(0)`` every 0.5 ms between kernels), but an
offer is paid whether anybody wants the GIL or not: with the loop idle (a single awaited
inference) an intra-op helper took it, and each offer cost 70-80 us of wall time on
the development machine (oww_embedding: 5 offers, +35% on a 2.8 ms inference). The
switch interval makes the interpreter switch only when a thread has waited that long
for the GIL: nothing to pay when nobody waits."""

_MAIN_THREAD = threading.main_thread().ident
"""The main thread's id: comparing ``get_ident()`` with it costs a fifth of
``threading.current_thread() is threading.main_thread()``, on every run."""


_responsive = False


def keep_loop_responsive() -> None:
    """Lower the interpreter's switch interval to :data:`GIL_YIELD_SECONDS` (once per
    process, and only when it is longer: ``aioinfer serve`` sets the same), so that a
    thread waiting for the GIL, an event loop's above all, gets it within that time
    while a plan computes on another thread. Called by every inference; nothing happens
    on the main thread (``infer_sync`` in a script: no loop waits there). A later
    :func:`sys.setswitchinterval` of the application's wins."""
    global _responsive
    if _responsive or threading.get_ident() == _MAIN_THREAD:
        return
    _responsive = True
    if sys.getswitchinterval() > GIL_YIELD_SECONDS:
        sys.setswitchinterval(GIL_YIELD_SECONDS)


_running = threading.local()
"""``token``: the CancelToken of the plan running on this thread (None outside a plan)."""


def current_cancel_token() -> CancelToken:
    """The cancel token of the plan running on this thread, so that a control-flow
    kernel's sub-plans stop with their parent; a fresh token outside any plan."""
    token = getattr(_running, "token", None)
    return token if token is not None else CancelToken()


CANCEL_EVERY = 32
"""Steps between two looks at the inference's cancel token (:func:`stop_if_cancelled`)
in a recurrent loop: a long sequence stops within this many steps of a cancel (a look
costs ~0.1 us; a step of the lean loops 3-10 us)."""


def stop_if_cancelled(token: CancelToken) -> None:
    """Raise :class:`~aioinfer.errors.InferCancelledError` once ``token`` is cancelled:
    the check of a kernel that loops (a Loop's iterations, a recurrent layer's steps)."""
    if token.requested:
        raise InferCancelledError("the inference was cancelled")


def swap_cancel_token(token: CancelToken | None) -> CancelToken | None:
    """Make ``token`` this thread's :func:`current_cancel_token`; return the one it was
    (a plan's run restores it when it ends; a plain function, no context manager: this
    is per inference)."""
    previous = getattr(_running, "token", None)
    _running.token = token
    return previous


class BranchChanged(Exception):
    """A guard step of a plan specialised on the branch an ``If`` took saw the other
    branch's condition (see :mod:`.specialize`): the caller runs a plan without it."""


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
    subplans: Mapping[str, Plan] = field(default_factory=dict)
    """The plans of the node's graph attributes (If, Loop, Scan), by attribute name."""
    scope: str = ""
    """The ``If`` nodes whose branches the step was inlined from (see
    :mod:`.specialize`), as error messages name them: ``"node 'a' (If): "``."""


Call = tuple[
    "Kernel",
    "Callable[[list[Any]], tuple[Any, ...]] | None",
    int,
    int,
    tuple[int, ...],
    tuple[int, ...],
    Step,
]
"""A step as the loop runs it: kernel, getter of its inputs (None: one input, in the
slot that follows), first input slot, output slot (-1: several, in the tuple that
follows), output slots, slots to free, the step."""


def _call(step: Step) -> Call:
    inputs, outputs = step.inputs, step.outputs
    getter = None if len(inputs) == 1 else itemgetter(*inputs) if inputs else _no_inputs
    single = outputs[0] if len(outputs) == 1 else -1
    first = inputs[0] if inputs else NONE_SLOT
    return (step.kernel, getter, first, single, outputs, step.release, step)


def _no_inputs(slots: list[Any]) -> tuple[Any, ...]:
    return ()


def _failed(step: Step, exc: Exception) -> InferenceError:
    return InferenceError(
        f"{step.scope}node {step.name!r} ({step.op_type}) failed: {type(exc).__name__}: {exc}"
    )


def releases(
    uses: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], pinned: set[int]
) -> list[tuple[int, ...]]:
    """For the ``(inputs, outputs)`` slots of steps in order: the slots each frees after
    it runs (those it is the last to read or write, unless ``pinned``)."""
    last_use: dict[int, int] = {}
    for index, (ins, outs) in enumerate(uses):
        for slot in (*ins, *outs):
            last_use[slot] = index
    return [
        tuple(sorted({s for s in (*ins, *outs) if last_use[s] == index} - pinned))
        for index, (ins, outs) in enumerate(uses)
    ]


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
    specialized: dict[Any, Plan] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """Versions of this plan specialised per input shapes (a sub-plan's cache, see
    :mod:`aioinfer.devices.cpu.specialize`)."""

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
    def calls(self) -> tuple[Call, ...]:
        """The steps as the loop runs them."""
        return tuple(_call(step) for step in self.steps)

    def run(
        self, inputs: Sequence[Any], cancel: CancelToken, observe: Observer | None = None
    ) -> list[Any]:
        """Run every step; return the output values.

        ``observe`` is called after every step. While it runs, ``cancel`` is this
        thread's :func:`current_cancel_token`.

        Raises:
            InferCancelledError: ``cancel.requested`` was set; checked before each kernel.
            InferenceError: a kernel raised; the message names the node.
        """
        # swap_cancel_token, inlined: this runs on every inference.
        running = _running
        previous = getattr(running, "token", None)
        running.token = cancel
        try:
            return self.run_steps(inputs, cancel, observe)
        finally:
            running.token = previous

    def run_steps(
        self, inputs: Sequence[Any], cancel: CancelToken, observe: Observer | None = None
    ) -> list[Any]:
        """:meth:`run` for a caller that already made ``cancel`` the thread's token (a
        control-flow kernel running its body)."""
        slots = self.initial_slots()
        for slot, array in zip(self.input_slots, inputs):
            slots[slot] = array
        if observe is None:  # no clock readings
            self._run_fast(slots, cancel)
        else:
            self._run_timed(slots, cancel, observe)
        return [slots[i] for i in self.output_slots]

    def _run_fast(self, slots: list[Any], cancel: CancelToken) -> None:
        for kernel, getter, first, single, outputs, release, step in self.calls:
            if cancel.requested:
                raise InferCancelledError("the inference was cancelled")
            try:
                produced = kernel(slots[first]) if getter is None else kernel(*getter(slots))
            except (InferCancelledError, BranchChanged):
                raise  # a sub-plan saw the cancellation; a guard saw its branch change
            except Exception as exc:
                raise _failed(step, exc) from exc
            if single >= 0:
                slots[single] = produced[0]
            else:
                for slot, value in zip(outputs, produced):
                    slots[slot] = value
            for slot in release:
                slots[slot] = None

    def _run_timed(self, slots: list[Any], cancel: CancelToken, observe: Observer) -> None:
        started = perf_counter()
        for kernel, getter, first, single, outputs, release, step in self.calls:
            if cancel.requested:
                raise InferCancelledError("the inference was cancelled")
            try:
                produced = kernel(slots[first]) if getter is None else kernel(*getter(slots))
            except (InferCancelledError, BranchChanged):
                raise
            except Exception as exc:
                raise _failed(step, exc) from exc
            if single >= 0:
                slots[single] = produced[0]
            else:
                for slot, value in zip(outputs, produced):
                    slots[slot] = value
            for slot in release:
                slots[slot] = None
            now = perf_counter()
            observe(step, produced, now - started)
            started = now
