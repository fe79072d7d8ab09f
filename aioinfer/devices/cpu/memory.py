"""Memory planning: each request writes the hot kernels' outputs into buffers it owns.

Shapes are known only when inputs arrive (most models have symbolic dimensions), so a
request plans memory per set of input shapes, the way onnxruntime's memory patterns do:

1. The first inference with new input shapes runs the plan normally and records the
   shape and dtype of every step's first output.
2. :func:`make_pattern` then gives every step that has an *out form* (see
   :func:`~aioinfer.devices.cpu.kernels.registry.out_kernel`) a buffer. A buffer is busy
   from the step that writes it to the last step that reads the value *or anything that
   may alias it* (a Reshape, Transpose or Identity of it, ...: every step without a buffer
   is assumed to return views of its inputs); buffers whose busy intervals do not
   overlap are shared (greedy best fit, in step order).
3. :class:`RequestMemory` allocates the buffers once and binds each planned step's out
   form to its buffer; later inferences with the same input shapes run those bound
   kernels and allocate nothing for the planned values.

Weights are not planned: they are the compiled model's constants, allocated once and
shared by every request. Graph outputs are never planned, and anything handed to the
user that is a view of a buffer is copied first (see ``request.py``), so results never
alias a request's buffers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from aioinfer.devices.cpu.plan import NONE_SLOT, SCRATCH_SLOT, Plan, Step


@dataclass(frozen=True)
class Assignment:
    """Step ``step`` writes its first output, of ``shape`` and ``dtype``, into buffer
    ``buffer``."""

    step: int
    buffer: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class MemoryPattern:
    """Buffer sizes (bytes) and which step writes into which, for one set of input shapes."""

    sizes: tuple[int, ...]
    assignments: tuple[Assignment, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers together: a request's planned activation memory."""
        return sum(self.sizes)

    def bind(self, plan: Plan) -> Plan:
        """Allocate the buffers; return ``plan`` with the planned steps' out forms bound
        to them as their kernels."""
        buffers = [np.empty(size, dtype=np.uint8) for size in self.sizes]
        steps = list(plan.steps)
        for a in self.assignments:
            nbytes = int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
            view = buffers[a.buffer][:nbytes].view(a.dtype).reshape(a.shape)
            s = steps[a.step]
            assert s.out_kernel is not None
            bound = functools.partial(s.out_kernel, view)
            steps[a.step] = Step(
                bound,
                s.inputs,
                s.outputs,
                s.release,
                s.name,
                s.op_type,
                s.execution_type,
                s.out_kernel,
                s.subplans,
                s.scope,
            )
        return replace(plan, steps=tuple(steps))


def _plannable(step: Step, value: Any, pinned: set[int]) -> bool:
    return (
        step.out_kernel is not None
        and len(step.outputs) >= 1
        and step.outputs[0] not in pinned
        and type(value) is np.ndarray
        and value.size > 0
        and value.dtype.kind in "biuf"
    )


def make_pattern(plan: Plan, first_outputs: Sequence[Any]) -> MemoryPattern:
    """Plan buffers from the first output of every step of one recorded run.

    ``first_outputs[i]`` is what step ``i`` produced as output 0.
    """
    steps = plan.steps
    pinned = (
        set(plan.output_slots)
        | set(plan.input_slots)
        | {slot for slot, _ in plan.constants}
        | {NONE_SLOT, SCRATCH_SLOT}
    )
    planned = {
        i
        for i, (step, value) in enumerate(zip(steps, first_outputs))
        if _plannable(step, value, pinned)
    }
    # end[slot]: the last step that reads the slot's value or a value that may alias it.
    end: dict[int, int] = dict.fromkeys(plan.output_slots, len(steps))
    for index in range(len(steps) - 1, -1, -1):
        step = steps[index]
        reach = index
        if index not in planned:
            reach = max([index, *(end.get(slot, index) for slot in step.outputs)])
        for slot in step.inputs:
            end[slot] = max(end.get(slot, index), reach)
    sizes: list[int] = []
    busy_until: list[int] = []
    assignments = []
    for index in sorted(planned):
        value = first_outputs[index]
        slot = steps[index].outputs[0]
        need = value.nbytes
        last = end.get(slot, index)
        free = [b for b, until in enumerate(busy_until) if until < index]
        fitting = [b for b in free if sizes[b] >= need]
        if fitting:
            buffer = min(fitting, key=lambda b: sizes[b])
        elif free:
            buffer = max(free, key=lambda b: sizes[b])
            sizes[buffer] = need
        else:
            buffer = len(sizes)
            sizes.append(need)
            busy_until.append(last)
        busy_until[buffer] = last
        assignments.append(Assignment(index, buffer, value.shape, value.dtype))
    return MemoryPattern(tuple(sizes), tuple(assignments))


def shapes_key(feed: Sequence[Any]) -> tuple[Any, ...]:
    """What a memory pattern depends on: the shapes and dtypes of the plan's inputs.

    Made on every inference: a list, not a generator, and the dtypes themselves, not
    their names (each ``dtype.str`` is a new string), take it from 0.53 to 0.20 us."""
    return tuple(
        [(x.shape, x.dtype) if isinstance(x, np.ndarray) else type(x).__name__ for x in feed]
    )


class RequestMemory:
    """One request's planned buffers, for the input shapes it ran last.

    :meth:`plan` gives the plan to run for a feed, or None when the shapes are new: then
    the caller runs a recording run (:func:`~aioinfer.devices.cpu.specialize.specialize`)
    and :meth:`commit` makes the pattern once the run completed.
    """

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._plan: Plan | None = None
        self.nbytes = 0
        """Bytes of the current pattern's buffers (0 before the first inference)."""

    def plan(self, key: tuple[Any, ...]) -> Plan | None:
        """The bound plan of the pattern for ``key``, or None when there is none yet."""
        return self._plan if key == self._key else None

    def release(self) -> None:
        """Drop the buffers; the next inference plans and allocates them again."""
        self._key = None
        self._plan = None
        self.nbytes = 0

    def commit(self, key: tuple[Any, ...], plan: Plan, first_outputs: Sequence[Any]) -> None:
        """Make and allocate the pattern of ``plan`` (specialised for ``key``) from a
        complete recorded run: ``first_outputs[i]`` is what step ``i`` produced first."""
        pattern = make_pattern(plan, first_outputs)
        self._key = key
        self._plan = pattern.bind(plan)
        self.nbytes = pattern.nbytes
