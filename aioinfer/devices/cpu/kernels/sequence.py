"""Sequence operators: a sequence value is a Python list of arrays in a plan slot.

Kernels never modify a list they receive (a slot's value may be shared with the user's
input or another slot); operators that change a sequence build a new list.
SequenceMap runs its body as a sub-plan once per element, like the control-flow kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel
from aioinfer.devices.cpu.plan import Plan, current_cancel_token
from aioinfer.errors import InferCancelledError


def _position(position: Any, length: int, allow_end: bool, op_type: str) -> int:
    """A (possibly negative) position in a sequence of ``length`` as an index."""
    index = int(np.asarray(position).reshape(-1)[0])
    upper = length if allow_end else length - 1
    if not -length <= index <= upper:
        raise IndexError(
            f"{op_type}: position {index} is out of range for a sequence of length {length}"
        )
    return index + length if index < 0 else index


@kernel("SequenceConstruct", since=11)
def _construct(spec: NodeSpec) -> Kernel:
    return lambda *tensors: (list(tensors),)


@kernel("SequenceEmpty", since=11)
def _empty(spec: NodeSpec) -> Kernel:
    return lambda: ([],)


@kernel("SequenceLength", since=11)
def _length(spec: NodeSpec) -> Kernel:
    return lambda sequence: (np.array(len(sequence), dtype=np.int64),)


@kernel("SequenceAt", since=11)
def _at(spec: NodeSpec) -> Kernel:
    def at(sequence: list[np.ndarray], position: np.ndarray) -> tuple[np.ndarray]:
        return (sequence[_position(position, len(sequence), False, "SequenceAt")],)

    return at


@kernel("SequenceInsert", since=11)
def _insert(spec: NodeSpec) -> Kernel:
    def insert(
        sequence: list[np.ndarray], tensor: np.ndarray, position: np.ndarray | None = None
    ) -> tuple[list[np.ndarray]]:
        index = len(sequence)
        if position is not None:
            index = _position(position, len(sequence), True, "SequenceInsert")
        return ([*sequence[:index], tensor, *sequence[index:]],)

    return insert


@kernel("SequenceErase", since=11)
def _erase(spec: NodeSpec) -> Kernel:
    def erase(
        sequence: list[np.ndarray], position: np.ndarray | None = None
    ) -> tuple[list[np.ndarray]]:
        index = len(sequence) - 1
        if position is not None:
            index = _position(position, len(sequence), False, "SequenceErase")
        return ([*sequence[:index], *sequence[index + 1 :]],)

    return erase


@kernel("SplitToSequence", since=11)
def _split_to_sequence(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 0))
    keepdims = bool(spec.attr("keepdims", 1))

    def split(x: np.ndarray, sizes: np.ndarray | None = None) -> tuple[list[np.ndarray]]:
        ax = axis + x.ndim if axis < 0 else axis
        length = x.shape[ax]
        if sizes is None:
            parts = np.split(x, length, axis=ax)
            return ([p if keepdims else np.squeeze(p, axis=ax) for p in parts],)
        sizes = np.asarray(sizes)
        if sizes.ndim == 0:
            step = int(sizes)
            bounds = list(range(step, length, step))
        else:
            if int(sizes.sum()) != length:
                raise ValueError(
                    f"SplitToSequence: split sizes {sizes.tolist()} do not add up to the "
                    f"length {length} of axis {axis}"
                )
            bounds = np.cumsum(sizes)[:-1].tolist()
        return (np.split(x, bounds, axis=ax),)

    return split


@kernel("ConcatFromSequence", since=11)
def _concat_from_sequence(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis"))
    new_axis = bool(spec.attr("new_axis", 0))

    def concat(sequence: list[np.ndarray]) -> tuple[np.ndarray]:
        if new_axis:
            return (np.stack(sequence, axis=axis),)
        return (np.concatenate(sequence, axis=axis),)

    return concat


@kernel("SequenceMap", since=17)
def _sequence_map(spec: NodeSpec) -> Kernel:
    body: Plan = spec.subplans["body"]
    count = spec.num_inputs

    def run(*inputs: Any) -> tuple[list[Any], ...]:
        values, captured = inputs[:count], list(inputs[count:])
        length = len(values[0])
        token = current_cancel_token()
        results: list[list[Any]] = [[] for _ in body.output_slots]
        for index in range(length):
            if token.requested:
                raise InferCancelledError("the inference was cancelled")
            args = [v[index] if isinstance(v, list) else v for v in values]
            for collected, value in zip(results, body.run([*args, *captured], token)):
                collected.append(value)
        return tuple(results)

    return run
