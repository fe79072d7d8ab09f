"""The ORT device's infer request: ``session.run`` in ``start_pipeline`` (on a task thread,
or on the event loop when it is short: see :mod:`aioinfer.plugin.inline`), with a ``RunOptions`` of
its own so that a cancel stops this request's run only."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from aioinfer.devices.ort.profile import RunProfile
from aioinfer.devices.ort.session import TERMINATED, ort_message
from aioinfer.errors import InferCancelledError, InferenceError, InputTypeError
from aioinfer.plugin.sync_request import SyncInferRequest

if TYPE_CHECKING:
    from aioinfer.devices.ort.plugin import ORTCompiledModel
    from aioinfer.model import Port


class ORTInferRequest(SyncInferRequest):
    """One infer request on the compiled model's onnxruntime session.

    The inputs are checked by the base class (the same errors as on every device);
    ``cancel()`` sets ``RunOptions.terminate``, which onnxruntime checks before each
    kernel; the flag is cleared before the next run. The output arrays onnxruntime
    returns are new for each run and handed to the caller as they are.
    """

    def __init__(self, compiled_model: ORTCompiledModel) -> None:
        super().__init__(compiled_model)
        self._name = compiled_model.name
        self._run = _raw_run(compiled_model.plain_session)
        self._single = compiled_model.single_thread
        self._single_run: Callable[..., list[Any]] | None = None
        self._run_options = ort.RunOptions()
        # A failing run is raised as an InferenceError with onnxruntime's message; its
        # log line on stderr would say the same again.
        self._run_options.log_severity_level = 4
        self._terminate_set = False
        """Whether a cancel set ``RunOptions.terminate`` since the last run cleared it
        (setting an option of onnxruntime's costs about as much as a dict of the feed)."""
        self._input_names = [port.name for port in self.inputs]
        self._output_names = [port.name for port in self.outputs]
        # onnxruntime's strings are text: these ports are converted (decided once here).
        self._text_inputs = frozenset(p.name for p in self.inputs if _is_text(p))
        self._text_outputs = [_is_text(port) for port in self.outputs]
        self._any_text_output = any(self._text_outputs)
        self._plain_inputs = not self._text_inputs and all(
            port.kind == "tensor" for port in self.inputs
        )
        """Every input is a required tensor fed as it is (no text, sequence or optional)."""
        self._feed: dict[str, Any] = {}
        self._shapes: tuple[object, ...] = ()
        self._checked_shapes: tuple[object, ...] | None = None
        """The input shapes of the last inference whose plain inputs passed the check."""
        self._times = compiled_model.run_times
        self._outputs: list[Any] = []
        self._run_profile: RunProfile | None = None
        if compiled_model.profiler is not None:
            self.node_profile = self._run_profile = RunProfile(compiled_model.profiler)

    def infer_preprocess(self) -> None:
        """Check the inputs (base class) and make the feed; an optional input left out
        is not fed. Plain inputs whose shapes are those of the last inference that
        passed the check are not checked again: the check depends on the shapes only."""
        inputs = self.input_tensors
        if self._plain_inputs:
            try:
                shapes = tuple(map(_shape_of, inputs))
            except AttributeError:  # an input with no value: the check names it
                shapes = None
            if shapes is None or shapes != self._checked_shapes:
                super().infer_preprocess()
                self._checked_shapes = shapes
            self._shapes = shapes  # type: ignore[assignment]
            self._feed = dict(zip(self._input_names, inputs))
            return
        super().infer_preprocess()
        self._feed = {
            name: _as_text(name, value) if name in self._text_inputs else value
            for name, value in zip(self._input_names, inputs)
            if value is not None
        }
        self._shapes = tuple(getattr(value, "shape", None) for value in inputs)

    def input_shapes(self) -> tuple[object, ...]:
        """The shapes of the inputs of the inference being run (None for a non-tensor)."""
        return self._shapes

    def start_pipeline(self) -> None:
        """Run the session on the feed and note how long the run took.

        Raises:
            InferCancelledError: ``cancel()`` was called before or during the run.
            InferenceError: onnxruntime failed (its message names the node).
        """
        options = self._run_options
        if self._terminate_set:  # by a cancel since: cleared, a cancel from now on stops
            self._terminate_set = False
            options.terminate = False
        if self.cancel_token.requested:
            raise InferCancelledError("the inference was cancelled")
        feed, self._feed = self._feed, {}
        single, on_one_thread = self._single, False
        start = time.perf_counter()
        try:
            if self._run_profile is not None:
                self._outputs = self._run_profile.profiler.run(
                    self._output_names, feed, options, self._run_profile
                )
            elif single is not None and single.use_single(self._shapes):
                if self._single_run is None:
                    self._single_run = _raw_run(single.session)
                assert self._single_run is not None
                on_one_thread = True
                self._outputs = self._single_run(self._output_names, feed, options)
            else:
                assert self._run is not None  # there is one when nothing profiles
                self._outputs = self._run(self._output_names, feed, options)
        except Exception as exc:  # onnxruntime's own exception classes
            message = ort_message(exc)
            if TERMINATED in message:
                raise InferCancelledError("the inference was cancelled") from None
            raise InferenceError(f"model {self._name!r} failed in onnxruntime: {message}") from None
        seconds = time.perf_counter() - start
        self._times.record(self._shapes, seconds)
        if single is not None:
            single.record(self._shapes, seconds, on_one_thread)

    def infer_postprocess(self) -> None:
        """Publish the arrays of the run."""
        outputs, self._outputs = self._outputs, []
        if self._any_text_output:
            outputs = [_as_bytes(v) if text else v for v, text in zip(outputs, self._text_outputs)]
        self.set_results(outputs)

    def cancel(self) -> None:
        """Stop the running inference before onnxruntime's next kernel (any thread)."""
        super().cancel()
        # In this order: a run that sees the flag sees the terminate flag set and the
        # cancel requested, so clearing them before it raises loses nothing.
        self._run_options.terminate = True
        self._terminate_set = True


def _raw_run(session: ort.InferenceSession | None) -> Callable[..., list[Any]] | None:
    """The session's run without its Python wrapper's checks, when it has the usual
    binding: the wrapper checks again what the request has checked (every required
    input is fed), and the rest of its work (graph capture, OrtValue ownership, falling
    back from a failed GPU provider) concerns inputs and providers this device never
    uses; about 2.5 us of the ~30 us a small model takes (profiled)."""
    if session is None:
        return None
    binding = getattr(session, "_sess", None)
    return binding.run if binding is not None and hasattr(binding, "run") else session.run


_shape_of = operator.attrgetter("shape")


def _is_text(port: Port) -> bool:
    return port.element_type == ir.DataType.STRING


def _as_text(name: str, value: np.ndarray) -> np.ndarray:
    """A string tensor as onnxruntime takes it: ``str`` elements (bytes decoded as UTF-8).

    Raises:
        InputTypeError: an element is bytes that are not UTF-8 text.
    """
    flat = value.ravel()
    texts = np.empty(flat.shape, dtype=object)
    for index, element in enumerate(flat):
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputTypeError(
                    f"input {name!r}: element {index} is not UTF-8 text ({exc.reason} at byte "
                    f"{exc.start}); onnxruntime's strings are text: run such bytes on CPU"
                ) from None
        texts[index] = element
    return texts.reshape(value.shape)


def _as_bytes(value: np.ndarray) -> np.ndarray:
    """A string tensor of onnxruntime's (``str`` elements) as the other devices give it:
    UTF-8 ``bytes`` elements."""
    flat = value.ravel()
    data = np.empty(flat.shape, dtype=object)
    for index, element in enumerate(flat):
        data[index] = element.encode("utf-8") if isinstance(element, str) else element
    return data.reshape(value.shape)
