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

A ``Concat`` whose inputs all come from planned steps and are read by nothing else (the
expand branches of SqueezeNet's fire modules, each a convolution) is *joined*: its output
gets the buffer, each producer writes into its part of it, and the Concat step only
checks that they did (see :class:`Join`).

Weights are not planned: they are the compiled model's constants, allocated once and
shared by every request. Graph outputs are never planned, and anything handed to the
user that is a view of a buffer is copied first (see ``request.py``), so results never
alias a request's buffers.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
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
    offset: int = 0
    """Where in the buffer the output starts (bytes): a part of a :class:`Join`."""


@dataclass(frozen=True)
class Join:
    """Step ``step``, a Concat whose output (``shape``, ``dtype``) has buffer
    ``buffer``, finds its inputs already in place: :class:`Assignment` s of
    ``parts`` wrote each producer's output into its part of that buffer (contiguous:
    every axis before the concatenated one has size 1)."""

    step: int
    buffer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    parts: tuple[Assignment, ...]


@dataclass(frozen=True)
class MemoryPattern:
    """Buffer sizes (bytes) and which step writes into which, for one set of input shapes."""

    sizes: tuple[int, ...]
    assignments: tuple[Assignment, ...]
    joins: tuple[Join, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers together: a request's planned activation memory."""
        return sum(self.sizes)

    def bind(self, plan: Plan) -> Plan:
        """Allocate the buffers; return ``plan`` with the planned steps' out forms bound
        to them as their kernels."""
        buffers = [np.empty(size, dtype=np.uint8) for size in self.sizes]

        def view(a: Assignment | Join, offset: int = 0) -> np.ndarray:
            nbytes = int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
            chunk = buffers[a.buffer][offset : offset + nbytes]
            return chunk.view(a.dtype).reshape(a.shape)

        steps = list(plan.steps)
        kernels = {
            a.step: functools.partial(_out_form(steps[a.step]), view(a, a.offset))
            for a in self.assignments
        }
        for j in self.joins:
            parts = tuple(view(a, a.offset) for a in j.parts)
            kernels[j.step] = _joined(view(j), parts, steps[j.step].kernel)
        for index, bound in kernels.items():
            s = steps[index]
            steps[index] = Step(
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


def _out_form(step: Step) -> Any:
    assert step.out_kernel is not None
    return step.out_kernel


def _joined(out: np.ndarray, parts: tuple[np.ndarray, ...], concat: Any) -> Any:
    """The kernel of a joined Concat (see :class:`Join`): its output is ``out``, whose
    ``parts`` the producers were given as their buffers. A producer that returned an
    array of its own (its out form may, see
    :data:`~aioinfer.devices.cpu.kernels.registry.OutKernel`) is copied into its part;
    inputs of other shapes than planned make it the plain ``concat``."""

    def run(*inputs: np.ndarray) -> Any:
        for x, part in zip(inputs, parts):
            if x.shape != part.shape:
                return concat(*inputs)
        for x, part in zip(inputs, parts):
            if not np.may_share_memory(x, part):
                np.copyto(part, x)
        return (out,)

    return run


def _plannable_value(value: Any) -> bool:
    return type(value) is np.ndarray and value.size > 0 and value.dtype.kind in "biuf"


def _plannable(step: Step, value: Any, pinned: set[int]) -> bool:
    return (
        step.out_kernel is not None
        and len(step.outputs) >= 1
        and step.outputs[0] not in pinned
        and _plannable_value(value)
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
    joins = _joins(steps, first_outputs, planned, pinned)
    parts = {p for producers in joins.values() for p in producers}
    # (first step using the buffer, step owning it): a join's buffer is busy from its
    # first producer on.
    owners = sorted(
        [(i, i) for i in planned if i not in parts] + [(min(ps), c) for c, ps in joins.items()]
    )
    sizes: list[int] = []
    busy_until: list[int] = []
    assignments = []
    joined = []
    for index, owner in owners:
        value = first_outputs[owner]
        slot = steps[owner].outputs[0]
        need = value.nbytes
        last = end.get(slot, owner)
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
        if owner not in joins:
            assignments.append(Assignment(owner, buffer, value.shape, value.dtype))
            continue
        offset = 0
        pieces = []
        for producer in joins[owner]:
            part = first_outputs[producer]
            pieces.append(Assignment(producer, buffer, part.shape, part.dtype, offset))
            offset += part.nbytes
        assignments += pieces
        joined.append(Join(owner, buffer, value.shape, value.dtype, tuple(pieces)))
    return MemoryPattern(tuple(sizes), tuple(assignments), tuple(joined))


def _joins(
    steps: Sequence[Step], first_outputs: Sequence[Any], planned: set[int], pinned: set[int]
) -> dict[int, tuple[int, ...]]:
    """The Concat steps that can be joined (see :class:`Join`), with their producers in
    input order: every input is the output of a planned step that only this Concat
    reads, of the Concat's dtype, and lands in one contiguous part of its output."""
    producer = {steps[i].outputs[0]: i for i in planned}
    readers = Counter(slot for step in steps for slot in step.inputs)
    found = {}
    for index, step in enumerate(steps):
        value = first_outputs[index]
        if (
            step.op_type != "Concat"
            or len(step.inputs) < 2
            or not _plannable_value(value)
            or step.outputs[0] in pinned
            or any(readers[slot] != 1 or slot not in producer for slot in step.inputs)
        ):
            continue
        producers = tuple(producer[slot] for slot in step.inputs)
        values = [first_outputs[p] for p in producers]
        if all(v.dtype == value.dtype for v in values) and _in_parts(
            [v.shape for v in values], value.shape
        ):
            found[index] = producers
    return found


def _in_parts(shapes: Sequence[tuple[int, ...]], joined: tuple[int, ...]) -> bool:
    """Whether arrays of ``shapes`` concatenated make ``joined``, each a contiguous part
    of it: they differ from it on one axis only, before which every axis has size 1."""
    differing = {a for shape in shapes for a, (n, m) in enumerate(zip(shape, joined)) if n != m}
    if len(differing) != 1 or any(len(shape) != len(joined) for shape in shapes):
        return False
    (axis,) = differing
    return math.prod(joined[:axis]) == 1 and sum(s[axis] for s in shapes) == joined[axis]


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
