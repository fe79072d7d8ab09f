"""Variable state: what a stateful model keeps across the inferences of one request.

A compiled model declares its :class:`Variable` s (made by the ``STATEFUL`` config); each
infer request holds their values in a :class:`VariableStore`, and
``request.query_state()`` hands them out as :class:`VariableState` objects.

Values are replaced, never modified in place: a stored array is read-only, and a step
that does not complete (cancelled or failed) leaves every value as it was.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from aioinfer.errors import (
    InferenceError,
    InputError,
    InputShapeError,
    InputTypeError,
    MissingInputError,
)
from aioinfer.model import Dim, Port, unnamed_dim_sizes


@dataclass(frozen=True)
class Variable:
    """A variable of a compiled model: the input it replaced and the output feeding it."""

    name: str
    """The variable's name: the name of the input it replaced."""
    output_name: str
    """The output whose value becomes the variable's value after each step."""
    element_type: ir.DataType
    shape: tuple[Dim, ...]
    """The input's partial shape: ints static, strings symbolic, None unknown (the
    compiler may have given an unknown dimension a size or a name, see
    :class:`aioinfer.transforms.make_stateful.SizeStatesPass`)."""

    @functools.cached_property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the element type."""
        return np.dtype(self.element_type.numpy())

    def initial_value(self, sizes: Mapping[str, int]) -> np.ndarray:
        """Zeros; a symbolic dimension takes its size from ``sizes`` (the regular inputs'
        dimensions), 0 when no input gives it (a KV cache's ``past_sequence``).

        Raises:
            MissingInputError: a dimension is unknown (unnamed, and the compiler found no
                size for it): zeros of what size cannot be told, so the state must be set.
        """
        if None in self.shape:
            axis = self.shape.index(None)
            raise MissingInputError(
                f"variable {self.name!r} has no value, and dimension {axis} of its shape "
                f"{_shape_text(self.shape)} is unknown, so its initial value cannot be "
                f"sized: set the state before the first inference (the VariableState "
                f"named {self.name!r} in request.query_state(): state.state = an array), "
                f"or give the dimension a size or the name of an input's dimension with "
                f"model.reshape({{{self.name!r}: [...]}}) before compiling"
            )
        dims = [d if isinstance(d, int) else sizes.get(str(d), 0) for d in self.shape]
        return _frozen(np.zeros(dims, self.dtype))

    def check(self, array: np.ndarray) -> None:
        """Raise when ``array`` cannot be the variable's value.

        Raises:
            InputTypeError: another element type.
            InputShapeError: another rank, or a static dimension that disagrees.
        """
        if array.dtype != self.dtype:
            raise InputTypeError(
                f"variable {self.name!r}: expected element type {self.dtype}, got {array.dtype}"
            )
        if array.ndim != len(self.shape):
            raise InputShapeError(
                f"variable {self.name!r}: expected rank {len(self.shape)} (shape "
                f"{_shape_text(self.shape)}), got shape {list(array.shape)}"
            )
        for axis, (dim, size) in enumerate(zip(self.shape, array.shape)):
            if isinstance(dim, int) and dim != size:
                raise InputShapeError(
                    f"variable {self.name!r}: expected shape {_shape_text(self.shape)}, got "
                    f"{list(array.shape)} (dimension {axis} is {size}, expected {dim})"
                )


def split_ports(
    inputs: Sequence[Port], outputs: Sequence[Port], variables: Sequence[tuple[str, str]]
) -> tuple[list[Port], list[Port], list[Variable]]:
    """The ports left once ``variables`` (input name, output name) became variables,
    re-indexed, and the variables in the given order."""
    taken_inputs = {i for i, _ in variables}
    taken_outputs = {o for _, o in variables}
    by_name = {p.name: p for p in inputs}
    # make-stateful accepts only inputs of known rank, so every shape is a tuple here.
    made = [Variable(i, o, by_name[i].element_type, by_name[i].shape or ()) for i, o in variables]
    kept_inputs = [p for p in inputs if p.name not in taken_inputs]
    kept_outputs = [p for p in outputs if p.name not in taken_outputs]
    return _reindexed(kept_inputs), _reindexed(kept_outputs), made


def dimension_sizes(ports: Sequence[Port], values: Sequence[Any]) -> dict[str, int]:
    """The sizes that input ``values`` (in port order, None where not set) give to the
    dimensions a variable's shape may name: each symbolic dimension (the first input that
    has it), and each unknown one by :func:`aioinfer.model.unnamed_dim_name` (a variable
    may follow it, see :class:`aioinfer.transforms.make_stateful.SizeStatesPass`)."""
    symbolic: dict[str, int] = {}
    for port, value in zip(ports, values):
        if port.shape is None or not isinstance(value, np.ndarray):
            continue
        for dim, size in zip(port.shape, value.shape):
            if isinstance(dim, str):
                symbolic.setdefault(dim, size)
    return {**unnamed_dim_sizes(ports, values), **symbolic}


def _reindexed(ports: Iterable[Port]) -> list[Port]:
    return [dataclasses.replace(p, index=i) for i, p in enumerate(ports)]


class VariableStore:
    """The variables of one infer request and their values.

    A variable without a value holds its initial value, computed when it is needed from
    ``sizes()`` (the sizes the request's inputs give to symbolic dimensions).
    """

    def __init__(
        self, variables: Sequence[Variable], sizes: Callable[[], Mapping[str, int]]
    ) -> None:
        self.variables = {v.name: v for v in variables}
        self._sizes = sizes
        self._values: dict[str, np.ndarray | None] = dict.fromkeys(self.variables)

    def value(self, name: str) -> np.ndarray:
        """The current (read-only) value of variable ``name``."""
        value = self._values[name]
        return self.variables[name].initial_value(self._sizes()) if value is None else value

    def set_value(self, name: str, value: Any) -> None:
        """Replace the value of ``name`` with a copy of ``value``.

        Raises:
            InputTypeError: ``value`` has another element type.
            InputShapeError: another rank, or a static dimension that disagrees.
        """
        variable = self.variables[name]
        array = _as_array(variable, value)
        variable.check(array)
        self._values[name] = _frozen(array.copy())

    def reset(self, name: str | None = None) -> None:
        """Give variable ``name`` (every variable when None) its initial value again."""
        for variable in self.variables if name is None else [name]:
            self._values[variable] = None

    def feed(self) -> list[np.ndarray]:
        """The values for the next step, in variable order. Initial values are computed
        (from the inputs set now) but not stored: a step that does not complete changes
        nothing."""
        sizes = self._sizes() if any(v is None for v in self._values.values()) else {}
        return [
            self.variables[name].initial_value(sizes) if value is None else value
            for name, value in self._values.items()
        ]

    def commit(self, values: Sequence[np.ndarray]) -> None:
        """Store the values a completed step produced (arrays the store may keep).

        Raises:
            InferenceError: a value disagrees with its variable (the model's output has
                another element type or shape than its input); nothing is stored then.
        """
        variables = list(self.variables.values())
        for variable, value in zip(variables, values, strict=True):
            try:
                variable.check(np.asarray(value))
            except InputError as exc:
                raise InferenceError(
                    f"output {variable.output_name!r} gave a value its variable cannot hold: "
                    f"{exc}; the state is unchanged"
                ) from None
        for variable, value in zip(variables, values):
            self._values[variable.name] = _frozen(np.asarray(value))

    def states(self, guard: Callable[[], None] | None = None) -> list[VariableState]:
        """One :class:`VariableState` per variable; ``guard`` runs before every change."""
        return [VariableState(self, name, guard) for name in self.variables]


class VariableState:
    """One variable of one infer request, as ``request.query_state()`` lists them.

    ``state`` reads the current value (a read-only array: copy it to modify it) and
    assigning to it replaces the value; ``reset()`` restores the initial value.
    """

    __slots__ = ("_guard", "_name", "_store")

    def __init__(
        self, store: VariableStore, name: str, guard: Callable[[], None] | None = None
    ) -> None:
        self._store = store
        self._name = name
        self._guard = guard

    @property
    def name(self) -> str:
        """The variable's name (the input it replaced)."""
        return self._name

    @property
    def state(self) -> np.ndarray:
        """The current value, read-only. Before the first step (and after a reset) it is
        the initial value: zeros, symbolic dimensions sized by the inputs set so far."""
        return self._store.value(self._name)

    @state.setter
    def state(self, value: Any) -> None:
        """Replace the value (copied) for the next step.

        Raises:
            InputTypeError: another element type than the variable's.
            InputShapeError: another rank, or a static dimension that disagrees.
            RequestBusyError: the request is running an inference.
        """
        if self._guard is not None:
            self._guard()
        self._store.set_value(self._name, value)

    def reset(self) -> None:
        """Restore the initial value (zeros, sized at the next inference).

        Raises:
            RequestBusyError: the request is running an inference.
        """
        if self._guard is not None:
            self._guard()
        self._store.reset(self._name)

    def __repr__(self) -> str:
        try:
            value = self.state
        except MissingInputError:  # no value, and no size to make zeros of
            return f"<VariableState {self._name!r} without a value>"
        return f"<VariableState {self._name!r} {value.dtype}{list(value.shape)}>"


def _as_array(variable: Variable, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputTypeError(f"variable {variable.name!r}: not an array ({exc})") from None
    if array.dtype != variable.dtype and np.can_cast(array.dtype, variable.dtype, "same_kind"):
        array = array.astype(variable.dtype)
    return array


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _shape_text(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
