"""The CPU device's infer request: the plan runs in ``start_pipeline`` on a task thread."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from aioinfer.devices.cpu.kernels.parallel import use_intra_op_threads
from aioinfer.devices.cpu.memory import RequestMemory, shapes_key
from aioinfer.devices.cpu.plan import BranchChanged, Plan, Step, keep_loop_responsive
from aioinfer.devices.cpu.specialize import specialize
from aioinfer.plugin.state import VariableState, VariableStore, dimension_sizes
from aioinfer.plugin.sync_request import SyncInferRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from aioinfer.devices.cpu.plugin import CPUCompiledModel


CPU_TIME_EVERY = 8
"""Of the runs whose shapes already run inline (see :mod:`.inline`), the CPU time of one
in this many is measured: reading a thread's CPU clock is a system call (2 us on a
virtual machine, two per run, a fifth of a one-kernel model's inference), and the
running average needs no more. Every other run is measured: the first of new shapes,
and those that are not short (yet), so the average comes down at the same pace."""


class CPUInferRequest(SyncInferRequest):
    """Runs the compiled plan over this request's inputs and variables.

    The variables' values go into the plan after the inputs; the new values come out
    after the outputs and are committed in ``infer_postprocess``, which runs only when
    the step completed: a cancelled or failed step leaves every variable as it was.
    """

    def __init__(self, compiled_model: CPUCompiledModel) -> None:
        super().__init__(compiled_model)
        self._plan = compiled_model.plan
        self._variables = VariableStore(compiled_model.variables, self._state_sizes)
        self._stateful = bool(compiled_model.variables)
        self._feed: list[Any] = []
        self._key: tuple[Any, ...] = ()
        self._run_times = compiled_model.run_times
        self._threads = compiled_model.threads_per_stream
        self._produced: list[Any] = []
        self._profiling = bool(compiled_model.config.get("PERF_COUNT", False))
        self._untimed = 0
        """Runs since the last one whose CPU time was measured."""
        self._speculate = True
        """Whether the plan inlines the branch an If on data takes (see specialize.py)."""
        self.memory = RequestMemory()
        """The request's planned activation buffers (see :mod:`.memory`)."""

    def _state_sizes(self) -> dict[str, int]:
        """What sizes a variable's initial value (see :func:`dimension_sizes`)."""
        return dimension_sizes(self.inputs, self.input_tensors)

    def query_state(self, guard: Callable[[], None] | None = None) -> list[VariableState]:
        return self._variables.states(guard)

    def release_memory(self) -> None:
        self.memory.release()

    def infer_preprocess(self) -> None:
        super().infer_preprocess()
        self._produced = []
        if self._stateful:
            self._feed = [*self.input_tensors, *self._variables.feed()]
        else:
            self._feed = list(self.input_tensors)
        self._key = shapes_key(self._feed)

    def input_shapes(self) -> tuple[Any, ...]:
        """The shapes (and dtypes) of the inputs of the inference being run."""
        return self._key

    def start_pipeline(self) -> None:
        use_intra_op_threads(self._threads)  # this compiled model's, on this thread
        keep_loop_responsive()
        plan = self.memory.plan(self._key)
        self._untimed += 1
        if plan is not None and self._untimed < CPU_TIME_EVERY and self._run_times.short(self._key):
            self._run_plan(plan)
            return
        self._untimed = 0
        started = time.thread_time()
        try:
            self._run_plan(plan)
        finally:
            seconds = time.thread_time() - started
            # The run that builds the shapes' plan also specialises and records it: its
            # time says the runs are short when it is short, and nothing otherwise.
            if plan is not None or seconds < self._run_times.budget:
                self._run_times.record(self._key, seconds)

    def _run_plan(self, plan: Plan | None) -> None:
        """Run ``plan`` (the request's bound plan for the inputs' shapes), or, when there
        is none (or it took another branch), specialise one and plan its memory."""
        feed, self._feed = self._feed, []
        key = self._key
        if plan is not None and not self._profiling:
            try:
                self._produced = plan.run(feed, self.cancel_token)
                return
            except BranchChanged:
                self._stop_speculating()
                plan = None
        observe = None
        if self._profiling:
            profile = self.node_profile
            profile.timings.clear()

            def observe(step: Step, produced: Sequence[Any], seconds: float) -> None:
                profile.add(step.name, step.op_type, step.execution_type, seconds)

        if plan is not None:
            try:
                self._produced = plan.run(feed, self.cancel_token, observe)
                return
            except BranchChanged:
                self._stop_speculating()
                profile.timings.clear()
        # New input shapes: specialise the plan for them, and plan memory from the run.
        made = specialize(self._plan, feed, self.cancel_token, observe, speculate=self._speculate)
        self.memory.commit(key, made.plan, made.first_outputs)
        self._produced = made.outputs

    def _stop_speculating(self) -> None:
        """An ``If`` on data took the other branch: specialise again without guessing
        (see :mod:`.specialize`)."""
        self._speculate = False
        self.memory.release()

    def infer_postprocess(self) -> None:
        produced, self._produced = self._produced, []
        count = len(self.outputs)
        if self._stateful:
            self._variables.commit(
                [_owned(value, self.input_tensors) for value in produced[count:]]
            )
        self.set_results([_owned(value, self.input_tensors) for value in produced[:count]])


def _owned(value: Any, inputs: list[Any]) -> Any:
    """``value`` as an array the user may keep: copied when it may alias shared memory
    (a weight, a user input, or a view into a buffer). A sequence (list) is owned item by
    item; an empty optional stays None."""
    if value is None:
        return None
    if isinstance(value, list):
        items = [x for x in inputs if not isinstance(x, list)]
        items += [item for x in inputs if isinstance(x, list) for item in x]
        return [_owned(item, items) for item in value]
    array = value if type(value) is np.ndarray else np.asarray(value)
    if array.dtype.kind == "U":  # kernels make numpy str; string ports are object arrays
        return array.astype(object)
    flags = array.flags
    if not flags.owndata or not flags.writeable:
        return array.copy()
    for item in inputs:
        if item is array:
            return array.copy()
    return array
