"""Variable state inside OpenVINO: ``STATEFUL`` pairs as OpenVINO's own variables.

OpenVINO's make-stateful transformation turns each pair's input (``Parameter``) and
output (``Result``) into a ``ReadValue``/``Assign`` variable, so the state stays in the
OpenVINO request between steps: nothing travels through Python per step. aioinfer's
semantics hold on top of OpenVINO's ``VariableState``:

- *Initial values.* OpenVINO resets a variable to zeros with every dynamic dimension 0
  (``[1, 0, 8]`` for an LSTM's ``h0 [1, ?, 8]``), which no step accepts. aioinfer's
  initial value is zeros sized by the step's inputs (see docs/stateful.md), so a variable
  at its initial value is marked *fresh*; before a step starts, each fresh variable gets
  those zeros, and the mark goes only when a step completes.
- *Atomic steps.* OpenVINO commits each variable when its ``Assign`` runs, so an
  inference cancelled or failed after some of them ran leaves those variables advanced
  and the others not (a KV cache whose concatenations take a while is cancelled between
  them most of the time; tests/devices/openvino/test_openvino_state.py). OpenVINO's CPU device keeps
  each variable in two buffers and an ``Assign`` writes the one not read, so the tensor
  ``VariableState.state`` gave before the step still holds the value from before: it is
  kept (no copy) when a step starts, and a step that does not complete writes it back
  into every variable that moved to the other buffer. An inference OpenVINO finished has
  advanced the state: the device then completes the step, also when its cancel came too
  late (see :mod:`.request`).
- *int64.* OpenVINO's CPU device computes int64 as int32 and refuses an int64 tensor as a
  variable's value; such a value is handed over as int32 (values beyond int32's range
  are refused with ``InputTypeError``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import openvino

from aioinfer.errors import CompileError, InferenceError, InputShapeError, InputTypeError
from aioinfer.plugin.state import Variable, VariableStore

_INT32 = np.iinfo(np.int32)


def make_stateful(ov_model: Any, pairs: Mapping[str, str], model_name: str) -> None:
    """Turn ``pairs`` ({input name: output name}) of OpenVINO's ``ov_model`` into
    OpenVINO variables, in place.

    Raises:
        CompileError: OpenVINO's model lacks a paired port (its ONNX frontend dropped an
            unused input, say), or OpenVINO refuses the transformation.
    """
    from openvino._offline_transformations import apply_make_stateful_transformation

    have = {name for port in (*ov_model.inputs, *ov_model.outputs) for name in port.get_names()}
    missing = [name for pair in pairs.items() for name in pair if name not in have]
    if missing:
        raise CompileError(
            f"model {model_name!r}: OpenVINO's model has no port(s) "
            f"{', '.join(map(repr, missing))} of STATEFUL {dict(pairs)!r}"
        )
    try:
        apply_make_stateful_transformation(ov_model, dict(pairs))
    except RuntimeError as exc:
        raise CompileError(
            f"model {model_name!r}: OpenVINO cannot make STATEFUL {dict(pairs)!r} variables: "
            f"{str(exc).strip().splitlines()[-1]}"
        ) from None


def variable_id(pair: tuple[str, str]) -> str:
    """The name OpenVINO's make-stateful gives the variable of ``pair``."""
    return pair[0] + pair[1]


class OpenVINOVariables(VariableStore):
    """The variables of one request, kept in its OpenVINO request's ``VariableState``s.

    ``value`` reads a copy out of OpenVINO (read-only, as on every device), ``set_value``
    writes into OpenVINO at once (the request is idle then), ``reset`` marks a variable
    fresh. :meth:`prepare` runs before each step, :meth:`commit` after a completed one.
    """

    def __init__(
        self,
        variables: Sequence[Variable],
        sizes: Callable[[], Mapping[str, int]],
        ov_request: Any,
    ) -> None:
        super().__init__(variables, sizes)
        by_id = {state.name: state for state in ov_request.query_state()}
        self._states = {}
        for variable in variables:
            state = by_id.get(variable_id((variable.name, variable.output_name)))
            if state is None:
                raise CompileError(
                    f"OpenVINO's request has no variable for {variable.name!r}; it has "
                    f"{sorted(by_id)}"
                )
            self._states[variable.name] = state
        self._fresh = set(self.variables)
        """Variables at their initial value (OpenVINO's value is not theirs yet)."""
        self._symbolic = [
            (v.name, axis, dim)
            for v in variables
            for axis, dim in enumerate(v.shape)
            if isinstance(dim, str)
        ]
        """Every symbolic dimension of a variable: checked against the inputs' before a
        step, as the inputs' are checked against each other."""
        self._held: list[tuple[Any, Any]] = []
        """Each OpenVINO variable with its tensor from before the running step."""
        self._held_shapes: list[tuple[int, ...]] = []

    def value(self, name: str) -> np.ndarray:
        variable = self.variables[name]
        if name in self._fresh:
            return variable.initial_value(self._sizes())
        # OpenVINO hands out its own memory, which the next step overwrites: a copy.
        array = np.array(self._states[name].state.data, dtype=variable.dtype, copy=True)
        array.flags.writeable = False
        return array

    def set_value(self, name: str, value: Any) -> None:
        # The checks and conversions of every device; OpenVINO copies the value in.
        checker = VariableStore([self.variables[name]], dict)
        checker.set_value(name, value)
        self._write(self.variables[name], checker.value(name))
        self._fresh.discard(name)

    def reset(self, name: str | None = None) -> None:
        for variable in self.variables if name is None else [name]:
            self._fresh.add(variable)

    def prepare(self) -> None:
        """Give each fresh variable its initial value in OpenVINO (zeros sized by the
        inputs set now; it stays fresh until a step completes), and keep every variable's
        value from before the step for :meth:`restore`.

        Raises:
            MissingInputError: a fresh variable's shape cannot be sized.
            InputShapeError: a variable's symbolic dimension disagrees with the inputs'.
        """
        if self._fresh or self._symbolic:
            self._check_and_fill()
        self._held = [(state, state.state) for state in self._states.values()]
        self._held_shapes = [tuple(held.shape) for _, held in self._held]

    def restore(self) -> None:
        """Undo what a step that did not complete (cancelled or failed in OpenVINO) left
        in OpenVINO's variables: each one whose value moved from the buffer kept by
        :meth:`prepare` gets that value back.

        Raises:
            InferenceError: OpenVINO wrote a variable's kept buffer in place, so its value
                from before the step is lost (the request's variables are then reset).
        """
        held, self._held = self._held, []
        for (state, before), shape in zip(held, self._held_shapes):
            if tuple(before.shape) != shape:
                self.reset()
                raise InferenceError(
                    f"OpenVINO changed variable {state.name!r} in place during a step that "
                    "did not complete, so its value from before the step is lost; the "
                    "request's variables were reset"
                )
            now = state.state
            if tuple(now.shape) != shape or _address(now) != _address(before):
                state.state = _settable(before)

    def _check_and_fill(self) -> None:
        sizes = self._sizes()
        for name in self._fresh:
            variable = self.variables[name]
            self._write(variable, variable.initial_value(sizes))
        for name, axis, dim in self._symbolic:
            if name in self._fresh or dim not in sizes:
                continue
            size = self._states[name].state.shape[axis]
            if size != sizes[dim]:
                raise InputShapeError(
                    f"variable {name!r} dimension {axis} ({dim!r}) is {size}, but the inputs "
                    f"give {dim!r} = {sizes[dim]}"
                )

    def commit(self, values: Sequence[np.ndarray] = ()) -> None:
        """A step completed: OpenVINO holds every variable's new value."""
        self._fresh.clear()
        self._held = []

    def _write(self, variable: Variable, array: np.ndarray) -> None:
        if array.dtype == np.int64:
            if array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
                raise InputTypeError(
                    f"variable {variable.name!r}: OpenVINO's CPU device keeps int64 state "
                    f"as int32, and the value holds numbers outside int32's range"
                )
            array = array.astype(np.int32)
        self._states[variable.name].state = openvino.Tensor(np.ascontiguousarray(array))


def _settable(tensor: Any) -> Any:
    """``tensor`` as OpenVINO's CPU device takes it back into a variable: it hands an
    int64 variable out as int64 (a converted copy) but keeps and takes it as int32."""
    if tensor.element_type == openvino.Type.i64:
        return openvino.Tensor(np.ascontiguousarray(np.asarray(tensor.data).astype(np.int32)))
    return tensor


def _address(tensor: Any) -> int:
    """Where an OpenVINO tensor's data starts."""
    return int(tensor.data.ctypes.data)
