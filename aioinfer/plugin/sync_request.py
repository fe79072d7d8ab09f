"""SyncInferRequest: a device's request, as four stages over the request's tensors."""

from __future__ import annotations

import dataclasses
import operator
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aioinfer.errors import (
    InputShapeError,
    InputTypeError,
    MissingInputError,
    UnknownInputError,
)
from aioinfer.model import Inputs, Port, find_port
from aioinfer.plugin.profiling import NodeProfile, profiling_info
from aioinfer.results import InferResults

if TYPE_CHECKING:
    from aioinfer.plugin.state import VariableState

STAGES = ("preprocess", "start", "wait", "postprocess")


class RequestSource(Protocol):
    """What a request asks of the compiled model that creates it (a
    :class:`~aioinfer.plugin.compiled_model.CompiledModel`): its ports and an id for the
    request. A device's request names its own compiled model class instead."""

    @property
    def inputs(self) -> list[Port]:
        """The inputs, in order."""

    @property
    def outputs(self) -> list[Port]:
        """The outputs, in order."""

    def next_request_id(self) -> int:
        """An id for the next request, unique within the compiled model."""


class CancelToken:
    """A flag the compute checks between kernels; set by ``cancel()`` from any thread."""

    __slots__ = ("requested",)

    def __init__(self) -> None:
        self.requested = False


class SyncInferRequest(ABC):
    """The device side of one infer request.

    Owns the input tensors, the last results and the stage timings. A device implements
    :meth:`start_pipeline` (the compute) and usually :meth:`infer_postprocess`; the base
    class validates inputs against the compiled model's ports.

    Inputs are copied when they are set, into buffers the request keeps and reuses while
    an input's shape and element type stay the same (no allocation per inference), so a
    caller may reuse its arrays at once; ``share_inputs=True`` keeps the caller's arrays
    instead (zero-copy: the caller must not modify them until the inference completed).
    """

    def __init__(self, compiled_model: RequestSource) -> None:
        self.compiled_model = compiled_model
        self.id = compiled_model.next_request_id()
        self._input_ports = compiled_model.inputs
        self._output_ports = compiled_model.outputs
        self._inputs: list[np.ndarray | None] = [None] * len(self._input_ports)
        self._buffers: list[np.ndarray | None] = [None] * len(self._input_ports)
        """The request's own copy of each input, reused while its shape and type stay."""
        self._input_by_name = {port.name: port for port in self._input_ports}
        self._accepts = [accepts_as_is(port) for port in self._input_ports]
        """Per input: a quick test that a value is an array the port takes as it is."""
        self._required = [p for p in self._input_ports if not p.kind.startswith("optional")]
        self._symbolic = [
            (port, axis, dim)
            for port in self._input_ports
            if port.shape is not None
            for axis, dim in enumerate(port.shape)
            if isinstance(dim, str)
        ]
        """Every symbolic dimension of an input: (port, axis, name)."""
        self._results: InferResults | None = None
        self.cancel_token = CancelToken()
        self.stage_durations: dict[str, float] = {}
        self.node_profile = NodeProfile()
        """Node timings of the last inference; a device fills it when profiling is on."""
        self.queued_seconds = 0.0
        """Seconds the last inference waited before it computed (for a free thread of the
        task executor, in a BATCH device's batch queue, for a stream of a PROCESS worker);
        0 when it computed at once. Devices with a queue of their own set it; the async
        request adds the time its stages waited for an executor thread."""

    # -- ports and tensors, for the stages -----------------------------------------------

    if TYPE_CHECKING:

        @property
        def inputs(self) -> list[Port]:
            """The compiled model's input ports, in order: a port's ``index`` is its
            position in :attr:`input_tensors`."""

        @property
        def outputs(self) -> list[Port]:
            """The compiled model's output ports, in the order :meth:`set_results` takes
            the arrays."""

        @property
        def input_tensors(self) -> list[Any]:
            """The inputs of the next inference, in input order: what the stages compute
            on. Each is an array (the request's copy, or the caller's with
            ``share_inputs``), a list of arrays for a sequence input, or None (not set
            yet, or an empty optional); :meth:`infer_preprocess` has checked that every
            required one is set. The list is the request's own: read it, and set inputs
            with :meth:`set_tensor`."""
    else:
        # The same, with getters in C: the stages of every inference read them, and a
        # property in Python would add a function call to each.
        inputs = property(operator.attrgetter("_input_ports"), doc="The input ports.")
        outputs = property(operator.attrgetter("_output_ports"), doc="The output ports.")
        input_tensors = property(
            operator.attrgetter("_inputs"),
            doc="The inputs of the next inference, in input order (the request's own list).",
        )

    # -- tensors --------------------------------------------------------------------------

    def set_tensor(self, key: str | int | Port, value: Any, *, share_inputs: bool = False) -> None:
        """Set the input ``key`` (name, index or Port) for the next inference.

        ``value`` is copied into the request's buffer for that input (allocated once per
        shape and element type); with ``share_inputs=True`` the request keeps ``value``
        itself, which must then stay unchanged until the inference completed.

        Raises:
            UnknownInputError: no such input.
            InputTypeError: wrong element type.
            InputShapeError: wrong rank, or a dimension that disagrees with the model.
        """
        port = self._input_by_name.get(key) if type(key) is str else None
        if port is None:
            port = find_port(self._input_ports, key, "input")
        accepts = self._accepts[port.index]
        array = value if accepts is not None and accepts(value) else check_input(port, value)
        self._inputs[port.index] = array if share_inputs else self._owned(port.index, array)

    def _owned(self, index: int, value: Any) -> Any:
        """A copy of ``value`` for input ``index``: in its reusable buffer when it is an
        array, fresh for a sequence; an empty optional stays None."""
        if not isinstance(value, np.ndarray):
            return owned_copy(value)
        buffer = self._buffers[index]
        if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
            buffer = self._buffers[index] = np.empty(value.shape, value.dtype)
        buffer[...] = value  # same shape and type: np.copyto's dispatch, without it
        return buffer

    def set_tensors(self, key: str | int | Port, values: Sequence[Any]) -> None:
        """Set input ``key`` from a list of tensors joined along the batch (first) axis
        (into a new array: the request never keeps the parts).

        Raises:
            InputShapeError: the list is empty or the parts disagree past the batch axis.
            InputTypeError, UnknownInputError: as for :meth:`set_tensor`.
        """
        port = find_port(self._input_ports, key, "input")
        if len(values) == 0:
            raise InputShapeError(f"input {port.name!r}: set_tensors needs at least one tensor")
        parts = [check_input(port, v, check_batch=False) for v in values]
        shapes = {p.shape[1:] for p in parts}
        if len(shapes) > 1:
            raise InputShapeError(
                f"input {port.name!r}: the tensors given to set_tensors differ past the "
                f"batch axis: {sorted(shapes)}"
            )
        self._inputs[port.index] = check_input(port, np.concatenate(parts, axis=0))

    def get_tensor(self, key: str | int | Port) -> np.ndarray:
        """The input named ``key`` (or that Port), or the output ``key`` of the last
        inference. An integer ``key`` is an output index.

        Raises:
            UnknownInputError: no input or output of that name.
            MissingInputError: the input has no value yet, or no inference ran yet.
        """
        if isinstance(key, (str, Port)):
            name = key.name if isinstance(key, Port) else key
            for port in self._input_ports:
                if port.name == name:
                    value = self._inputs[port.index]
                    if value is None:
                        raise MissingInputError(
                            f"input {name!r} has no value yet; set_tensor() or infer() first"
                        )
                    return value
        port = find_port(self._output_ports, key, "output")
        if self._results is None:
            raise MissingInputError(f"output {port.name!r} is not computed yet; run infer first")
        return self._results[port.index]

    def set_inputs(self, inputs: Inputs | None, *, share_inputs: bool = False) -> None:
        """Set several inputs at once: a mapping by name/index/Port, a list or tuple by
        position, or one value for the first input (copied, or kept with
        ``share_inputs=True``: see :meth:`set_tensor`).

        Raises:
            InputTypeError: ``inputs`` is a string or bytes (not a container of inputs),
                or a value of the wrong element type.
            UnknownInputError, InputShapeError: as :meth:`set_tensor` raises them; more
                values by position than the model has inputs.
        """
        if inputs is None:
            return
        if type(inputs) is dict or isinstance(inputs, Mapping):
            by_name, accepts, buffers, kept = (
                self._input_by_name,
                self._accepts,
                self._buffers,
                self._inputs,
            )
            for key, value in inputs.items():
                # set_tensor's common case written out (an array by name that needs no
                # conversion, copied into its buffer): after an engine's run evicted the
                # caches, each call and attribute read here costs a few times what it
                # does in a tight loop (profiled on the real-models benchmark).
                port = by_name.get(key) if type(key) is str else None
                test = None if port is None else accepts[port.index]
                if test is None or not test(value):
                    self.set_tensor(key, value, share_inputs=share_inputs)
                    continue
                index = port.index  # type: ignore[union-attr]
                buffer = buffers[index]
                if share_inputs:
                    kept[index] = value
                elif buffer is not None and buffer.shape == value.shape:  # dtype: tested
                    np.copyto(buffer, value)
                    kept[index] = buffer
                else:
                    kept[index] = self._owned(index, value)
            return
        if isinstance(inputs, (str, bytes, bytearray)):
            # A sequence, but of characters: never the inputs by position.
            raise InputTypeError(
                f"incompatible inputs of type {type(inputs).__name__}: give a dict from "
                "input name, index or Port to value, a list or tuple of values by position, "
                "or one array"
            )
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            inputs = [inputs]
        if len(inputs) > len(self._input_ports):
            names = ", ".join(repr(p.name) for p in self._input_ports)
            raise UnknownInputError(
                f"{len(inputs)} inputs given by position, the model has "
                f"{len(self._input_ports)}: {names}"
            )
        for index, value in enumerate(inputs):
            self.set_tensor(index, value, share_inputs=share_inputs)

    def validated(self, inputs: Inputs, *, share_inputs: bool = False) -> list[Any]:
        """Check ``inputs`` as an inference would (names, element types, shapes, missing
        inputs, symbolic dimensions) and return them in input order, without keeping
        them: for a device that takes inputs without a request of its own. They are
        fresh copies, or the caller's arrays with ``share_inputs=True``.

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: as
                :meth:`infer` raises them.
        """
        try:
            self.set_inputs(inputs, share_inputs=True)
            SyncInferRequest.infer_preprocess(self)
            checked = list(self._inputs)
            return checked if share_inputs else [owned_copy(value) for value in checked]
        finally:
            self.clear_inputs()

    def clear_inputs(self) -> None:
        """Forget every input set so far: the next inference needs all of them again."""
        self._inputs = [None] * len(self._input_ports)

    def release_memory(self) -> None:
        """Free what the request keeps between inferences to run the next one faster
        (a device's buffers); the next inference allocates again. Called only while no
        inference runs. Nothing to free here; a device with buffers overrides this."""

    @property
    def results(self) -> InferResults | None:
        """The results of the last completed inference (None before the first)."""
        return self._results

    # -- variable state -------------------------------------------------------------------

    def query_state(self, guard: Callable[[], None] | None = None) -> list[VariableState]:
        """The request's variables; none here (a device with variables overrides this).

        ``guard`` runs before every change of a state (the async request passes its busy
        check).
        """
        return []

    def reset_state(self) -> None:
        """Give every variable its initial value again."""
        for state in self.query_state():
            state.reset()

    def symbolic_sizes(self) -> dict[str, int]:
        """The sizes that the inputs set so far give to symbolic dimensions."""
        sizes: dict[str, int] = {}
        for port, value in zip(self._input_ports, self._inputs):
            if port.shape is None or not isinstance(value, np.ndarray):
                continue
            for dim, size in zip(port.shape, value.shape):
                if isinstance(dim, str):
                    sizes.setdefault(dim, size)
        return sizes

    # -- stages ---------------------------------------------------------------------------

    def infer_preprocess(self) -> None:
        """Check that every input is set and that symbolic dimensions agree across inputs.

        Raises:
            MissingInputError: an input has no value.
            InputShapeError: two inputs give different sizes to one symbolic dimension.
        """
        # An optional input that was not set is the empty optional (None).
        inputs = self._inputs
        missing = [p.name for p in self._required if inputs[p.index] is None]
        if missing:
            raise MissingInputError(f"no value for input(s) {', '.join(map(repr, missing))}")
        if len(self._symbolic) < 2:
            return  # nothing to agree with
        seen: dict[str, tuple[int, str]] = {}
        for port, axis, dim in self._symbolic:
            array = inputs[port.index]
            assert array is not None
            size = array.shape[axis]
            first = seen.setdefault(dim, (size, port.name))
            if first[0] != size:
                raise InputShapeError(
                    f"input {port.name!r} dimension {axis} ({dim!r}) is {size}, but "
                    f"input {first[1]!r} gives {dim!r} = {first[0]}"
                )

    @abstractmethod
    def start_pipeline(self) -> None:
        """Run (or launch) the compute; runs on the task executor."""

    def wait_pipeline(self) -> None:
        """Wait for the compute to finish (nothing to do for a device that computes in
        ``start_pipeline``)."""

    @abstractmethod
    def infer_postprocess(self) -> None:
        """Turn device outputs into the user's results (see :meth:`set_results`)."""

    def set_results(self, arrays: Sequence[np.ndarray]) -> None:
        """Publish the outputs of the inference that just completed."""
        self._results = InferResults(self._output_ports, list(arrays))

    def cancel(self) -> None:
        """Ask the running compute to stop at the next kernel boundary."""
        self.cancel_token.requested = True

    # -- the synchronous path -------------------------------------------------------------

    def infer(self, inputs: Inputs | None = None, *, share_inputs: bool = False) -> InferResults:
        """Run one inference in the calling thread: the same four stages, timed
        (``share_inputs``: see :meth:`set_tensor`)."""
        self.set_inputs(inputs, share_inputs=share_inputs)
        self.cancel_token.requested = False
        return self.run_stages()

    def run_stages(self) -> InferResults:
        """Run the four stages on the inputs set, timed, and return the results (a
        cancel requested before the call stops the inference at its first kernel)."""
        durations = self.stage_durations
        start = time.perf_counter()
        for name, stage in zip(STAGES, self.stages()):
            try:
                stage()
            finally:
                # One clock read per stage: a stage ends when the next starts.
                end = time.perf_counter()
                durations[name] = end - start
                start = end
        assert self._results is not None
        return self._results

    def stages(self) -> tuple[Callable[[], None], ...]:
        """The four stages in order."""
        return (
            self.infer_preprocess,
            self.start_pipeline,
            self.wait_pipeline,
            self.infer_postprocess,
        )

    def get_profiling_info(self) -> list[dict[str, Any]]:
        """Durations of the last inference: one entry per stage (``{"name", "type":
        "stage", "seconds"}``), then, when the compiled model has ``PERF_COUNT`` on, one
        per executed node (``{"name", "type": "node", "op_type", "execution_type",
        "seconds"}``, execution type ``native``, ``fused`` or ``fallback``)."""
        return profiling_info(STAGES, self.stage_durations, self.node_profile.timings)


def check_input(port: Port, value: Any, check_batch: bool = True) -> np.ndarray:
    """``value`` as an array for ``port``, or a clear error naming the port.

    A numpy array must have the port's element type exactly; other array-likes (lists,
    scalars: Python's, numpy's, and 0-d arrays, which is what ``np.array(2.0)`` makes) are
    converted when the conversion cannot change their kind. A sequence port takes a list
    of such tensors, an optional port also takes None.
    """
    if port.kind != "tensor":
        return _check_container(port, value)
    expected = port.dtype
    if isinstance(value, np.ndarray) and value.ndim:
        array = value
        if expected.kind == "O" and array.dtype.kind == "U":
            array = array.astype(object)  # string tensors: numpy str accepted too
        if array.dtype != expected:
            raise InputTypeError(
                f"input {port.name!r}: expected element type {expected}, got {array.dtype}"
            )
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(f"input {port.name!r}: not an array ({exc})") from None
        if array.dtype != expected:
            if not np.can_cast(array.dtype, expected, "same_kind"):
                raise InputTypeError(
                    f"input {port.name!r}: expected element type {expected}, "
                    f"got {array.dtype} values"
                )
            array = array.astype(expected)
    if port.shape is not None:
        if array.ndim != len(port.shape):
            raise InputShapeError(
                f"input {port.name!r}: expected rank {len(port.shape)} "
                f"(shape {_shape_text(port.shape)}), got shape {list(array.shape)}"
            )
        for axis, (dim, size) in enumerate(zip(port.shape, array.shape)):
            if axis == 0 and not check_batch:
                continue
            if isinstance(dim, int) and dim != size:
                raise InputShapeError(
                    f"input {port.name!r}: expected shape {_shape_text(port.shape)}, got "
                    f"{list(array.shape)} (dimension {axis} is {size}, expected {dim})"
                )
    return array


def accepts_as_is(port: Port) -> Callable[[Any], bool] | None:
    """For a tensor port of known rank: a test that is True when a value is a numpy array
    that :func:`check_input` would return unchanged (element type and every fixed
    dimension match), done in a fraction of its time; None for other ports. A value it
    refuses still goes through :func:`check_input`, which converts it or names the error.
    """
    if port.kind != "tensor" or port.shape is None:
        return None
    expected = port.dtype
    shape = tuple(port.shape)
    fixed = [(axis, dim) for axis, dim in enumerate(shape) if isinstance(dim, int)]
    if len(fixed) == len(shape):

        def static(value: Any) -> bool:
            return type(value) is np.ndarray and value.shape == shape and value.dtype == expected

        return static
    rank = len(shape)
    # The fixed dimensions of a shape, read in C (itemgetter of one axis gives a size,
    # not a tuple: a tuple of none or one axes is compared as a slice).
    fixed_of = operator.itemgetter(*(axis for axis, _ in fixed)) if len(fixed) > 1 else None
    sizes = tuple(dim for _, dim in fixed)
    first = fixed[0][0] if fixed else 0

    def dynamic(value: Any) -> bool:
        if type(value) is not np.ndarray or value.ndim != rank or value.dtype != expected:
            return False
        if fixed_of is not None:
            return fixed_of(value.shape) == sizes
        return value.shape[first : first + len(sizes)] == sizes

    return dynamic


def owned_copy(value: Any) -> Any:
    """A copy of a checked input: of an array, of each array of a sequence; None stays."""
    if value is None:
        return None
    if isinstance(value, list):
        return [owned_copy(item) for item in value]
    return np.array(value, copy=True)


def _check_container(port: Port, value: Any) -> Any:
    """``value`` for a sequence or optional ``port``: a list of arrays, an array, or None."""
    if value is None:
        if port.kind.startswith("optional"):
            return None
        raise InputTypeError(f"input {port.name!r}: expected a sequence of tensors, got None")
    element = dataclasses.replace(port, shape=None, kind="tensor")
    if port.kind == "optional":
        return check_input(element, value)
    if isinstance(value, (np.ndarray, str, bytes)) or not isinstance(value, Sequence):
        raise InputTypeError(
            f"input {port.name!r}: expected a sequence (a list of tensors), "
            f"got {type(value).__name__}"
        )
    return [check_input(element, item) for item in value]


def _shape_text(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
