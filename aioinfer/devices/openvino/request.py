"""The OPENVINO device's infer request: one OpenVINO ``InferRequest``, started with
OpenVINO's own ``start_async`` and awaited through :mod:`.bridge`.

On the event loop, the stages are: check the inputs and hand them to OpenVINO without a
copy (``infer_preprocess``; an input array OpenVINO already holds, such as the request's
own input buffer, is not handed over again), start OpenVINO's request
(``start_on_loop``), await its completion (``wait_async``), copy the outputs out of
OpenVINO's tensors (``infer_postprocess``). OpenVINO computes on its own threads and a
waiter thread wakes the loop (see :mod:`.bridge`), so no Python code runs on OpenVINO's
threads. A short inference with one stream runs inline instead (see :mod:`.inline`).
The synchronous path (``infer_sync``, the PROCESS worker) starts the same way and
blocks in OpenVINO's ``wait()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import TYPE_CHECKING

import anyio
import numpy as np
import openvino

from aioinfer.errors import InferCancelledError, InferenceError
from aioinfer.plugin.inline import before_inline_run
from aioinfer.plugin.state import dimension_sizes
from aioinfer.plugin.sync_request import SyncInferRequest

from .bridge import Completion, NoCompletion, Waiter, completion, let_go
from .engine import failure_message
from .inline import InlineRuns
from .state import OpenVINOVariables

if TYPE_CHECKING:
    from collections.abc import Callable

    from aioinfer.model import Inputs
    from aioinfer.plugin.state import VariableState

    from .compiled_model import OpenVINOCompiledModel

_SYNC = NoCompletion()
_EXECUTED = openvino.ProfilingInfo.Status.EXECUTED


class OpenVINOInferRequest(SyncInferRequest):
    """One aioinfer request over one OpenVINO request.

    Inputs are shared with OpenVINO (a C-contiguous, writeable array is not copied; the
    caller must not change it while the inference runs, as on every device); outputs
    are copied, so that the caller owns them.
    """

    def __init__(self, compiled_model: OpenVINOCompiledModel) -> None:
        super().__init__(compiled_model)
        self._ov = compiled_model.ov_compiled_model.create_infer_request()
        self._waiter: Waiter | None = None
        """The thread that waits for this request's awaited inferences (see
        :mod:`.bridge`), started by the first one."""
        self._input_indices = compiled_model.ov_input_indices
        self._output_indices = compiled_model.ov_output_indices
        self._kept: list[np.ndarray] = []
        """Copies made for OpenVINO of inputs it cannot share, alive until the next one."""
        self._producers = compiled_model.producers
        self._profiling = compiled_model.profiling
        self._lock = threading.Lock()
        """Orders ``cancel()`` (any thread) against the start of an inference."""
        self._completion: Completion = _SYNC
        self._runs: InlineRuns = compiled_model.inline_runs
        self._shapes: tuple[object, ...] = ()
        self._inline = False
        """The running inference ran inline (in :meth:`start_on_loop`)."""
        self._held: list[tuple[np.ndarray, tuple[int, ...]] | None] = [None] * len(
            compiled_model.ov_compiled_model.inputs
        )
        """Per OpenVINO input, the array (and its shape) OpenVINO's tensor shares now."""
        self._variables = (
            OpenVINOVariables(compiled_model.variables, self._state_sizes, self._ov)
            if compiled_model.variables
            else None
        )

    def _state_sizes(self) -> dict[str, int]:
        return dimension_sizes(self.inputs, self.input_tensors)

    def query_state(self, guard: Callable[[], None] | None = None) -> list[VariableState]:
        """The variables OpenVINO keeps in this request (see :mod:`.state`)."""
        return [] if self._variables is None else self._variables.states(guard)

    # -- stages ---------------------------------------------------------------------------

    def infer_preprocess(self) -> None:
        """Check the inputs (base class), then set them on OpenVINO's request."""
        super().infer_preprocess()
        set_input = self._ov.set_input_tensor
        kept, held = self._kept, self._held
        kept.clear()
        shapes = []
        for index, value in zip(self._input_indices, self.input_tensors):
            if index is None or value is None:
                continue  # an input OpenVINO's frontend found unused; an empty optional
            shapes.append(value.shape)
            last = held[index]
            if last is not None and last[0] is value and last[1] == value.shape:
                continue  # OpenVINO's tensor shares this very array already
            if not (value.flags.c_contiguous and value.flags.writeable):
                value = np.array(value, order="C")  # OpenVINO shares only such arrays
                kept.append(value)  # the shared memory must outlive the inference
            set_input(index, openvino.Tensor(value, shared_memory=True))
            held[index] = (value, value.shape)
        self._shapes = tuple(shapes)

    def start_pipeline(self) -> None:
        """Start OpenVINO's request (the synchronous path waits in :meth:`wait_pipeline`).

        Raises:
            InferCancelledError: :meth:`cancel` was called before it started.
        """
        self._start(_SYNC)

    def start_on_loop(self) -> None:
        """Start OpenVINO's request with a completion for the running event loop; a
        short one (see :mod:`.inline`) is only prepared here and runs in
        :meth:`wait_async`.

        Raises:
            InferCancelledError: :meth:`cancel` was called before it started.
        """
        runs = self._runs
        if runs.short(self._shapes):
            if self._variables is not None:
                self._variables.prepare()
            self._completion = _SYNC
            self._inline = True
            return
        waker = completion()
        self._start(waker)
        self._waiting().watch(waker)
        runs.in_flight += 1

    def _run_inline(self) -> None:
        """Run a short inference to its end on this thread (see :mod:`.inline`).

        Raises:
            InferCancelledError: :meth:`cancel` was called before it started.
            InferenceError: OpenVINO failed.
        """
        runs = self._runs
        with self._lock:
            if self.cancel_token.requested:
                raise InferCancelledError("the inference was cancelled")
        try:
            if runs.method(self._shapes):
                start = time.perf_counter()
                self._ov.infer(None, share_outputs=True)  # outputs copied in postprocess
                runs.record(self._shapes, time.perf_counter() - start, inline=True)
            else:
                self._ov.start_async()
                self._ov.wait()
                runs.record(self._shapes, self._ov.latency / 1e3, inline=False)
        except RuntimeError as exc:
            let_go(self._ov)
            raise self._failure(exc) from None

    def _start(self, waker: Completion) -> None:
        if self._variables is not None:
            self._variables.prepare()
        with self._lock:
            if self.cancel_token.requested:
                raise InferCancelledError("the inference was cancelled")
            self._completion = waker
            self._ov.start_async()

    def _waiting(self) -> Waiter:
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = Waiter(self._ov)
            weakref.finalize(self, waiter.close)
        return waiter

    def wait_pipeline(self) -> None:
        """Block until OpenVINO's request has finished.

        Raises:
            InferCancelledError: the inference was cancelled.
            InferenceError: OpenVINO failed (the message names the ONNX node).
        """
        try:
            self._ov.wait()
        except RuntimeError as exc:
            let_go(self._ov)  # a cancelled request's wait() raises before it ended
            raise self._failure(exc) from None

    async def wait_async(self) -> None:
        """Await OpenVINO's request on the event loop; raises as :meth:`wait_pipeline`.

        Woken by the request's waiter thread when the inference ended, however it ended
        (see :mod:`.bridge`). Cancelling the awaiting task cancels OpenVINO's request and
        waits (shielded) until OpenVINO has let go of it.

        A stateful step that OpenVINO finished has advanced OpenVINO's variables: it
        completes even when its cancel came too late to stop it (its results are
        published, then the task's cancellation goes on). One that OpenVINO did not
        finish gives back what its variables had before (see :mod:`.state`), so that a
        step reported cancelled never changed the state.
        """
        if self._inline:
            # Give the loop a turn when it is due (a task inferring in a loop must not
            # starve the others; a cancel asked for meanwhile stops the inference before
            # it starts), then run it to its end: nothing interrupts it once it started.
            self._inline = False
            checkpoint = before_inline_run(self._runs.budget)
            if checkpoint is not None:
                await checkpoint
            self._run_inline()
            return
        waker = self._completion
        try:
            await waker.wait()
        except anyio.get_cancelled_exc_class() as exc:
            self.cancel()
            with anyio.CancelScope(shield=True):
                await waker.wait()
            if self._variables is None:
                raise
            if not self._succeeded():
                self._variables.restore()
                raise
            # OpenVINO finished (and committed the state) before the cancel reached it:
            # the step completes. A cancel scope's cancel reaches the task again once it
            # did; asyncio's own task.cancel() is raised now, after the results.
            if not _from_a_cancel_scope(exc):
                self.infer_postprocess()
                raise
        finally:
            self._runs.in_flight -= 1
        self.wait_pipeline()  # returns at once; raises the failure or the cancel
        self._runs.record(self._shapes, self._ov.latency / 1e3, inline=False)
        if self._variables is not None:
            self.cancel_token.requested = False  # too late: OpenVINO committed the step

    def _succeeded(self) -> bool:
        """Whether OpenVINO's finished request succeeded (call once it ended)."""
        try:
            self._ov.wait()
        except RuntimeError:
            return False
        return True

    def infer_postprocess(self) -> None:
        """Copy the outputs out of OpenVINO's tensors (the next inference reuses them)."""
        self.set_results(self.output_arrays())
        if self._variables is not None:
            self._variables.commit()

    def output_arrays(self) -> list[np.ndarray]:
        """Copies of OpenVINO's output tensors (and its node timings, with
        ``PERF_COUNT``)."""
        get_output = self._ov.get_output_tensor
        arrays = [
            np.array(get_output(index).data, dtype=port.dtype)
            for port, index in zip(self.outputs, self._output_indices)
        ]
        if self._profiling:
            timings = self.node_profile
            timings.timings.clear()
            for info in self._ov.profiling_info:
                if info.status == _EXECUTED:
                    seconds = info.real_time.total_seconds()
                    timings.add(info.node_name, info.node_type, "native", seconds)
        return arrays

    # -- the queue's jobs (see :mod:`.queue_engine`; stateless models only) -----------------

    @property
    def ov_request(self) -> openvino.InferRequest:
        """OpenVINO's request."""
        return self._ov

    def prepare_job(self, inputs: Inputs | None, *, share_inputs: bool) -> None:
        """Set and check ``inputs`` for :meth:`launch_job`; any thread, while no job runs.

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: bad
                input.
        """
        self.set_inputs(inputs, share_inputs=share_inputs)
        self.cancel_token.requested = False
        self.infer_preprocess()

    def launch_job(self) -> None:
        """Start OpenVINO's request on the prepared job (any thread).

        Raises:
            InferCancelledError: :meth:`cancel` was called since it was prepared.
            InferenceError: OpenVINO refused to start it.
        """
        try:
            self._start(_SYNC)
        except RuntimeError as exc:
            raise self._failure(exc) from None

    def finish_job(self, succeeded: bool) -> list[np.ndarray]:
        """The outputs of the job that OpenVINO has ended (any thread); ``succeeded``:
        its ``wait()`` returned (else the failure is raised).

        Raises:
            InferCancelledError: the job was cancelled.
            InferenceError: OpenVINO failed (the message names the ONNX node).
        """
        if not succeeded:
            self.wait_pipeline()  # raises the failure
        return self.output_arrays()

    def cancel(self) -> None:
        """Cancel OpenVINO's request (it stops at the next node); any thread."""
        with self._lock:
            super().cancel()
            self._ov.cancel()

    def _failure(self, exc: BaseException) -> Exception:
        """The exception of an inference OpenVINO did not finish, once what it left in
        the variables was undone (see :mod:`.state`)."""
        if self._variables is not None:
            self._variables.restore()
        if self.cancel_token.requested:
            return InferCancelledError("the inference was cancelled")
        return InferenceError(failure_message(exc, self._producers))


def _from_a_cancel_scope(exc: BaseException) -> bool:
    """Whether a cancellation comes from an anyio or trio cancel scope, which cancels
    again at the task's next checkpoint (asyncio's own ``task.cancel()`` does not)."""
    if not isinstance(exc, asyncio.CancelledError):
        return True  # trio: every cancellation is a scope's
    return any(isinstance(a, str) and a.startswith("Cancelled via cancel scope ") for a in exc.args)
