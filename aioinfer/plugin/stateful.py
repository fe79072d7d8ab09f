"""Variable state above the device: ``STATEFUL`` for every device.

ONNX has no state operator, so a stateful model takes its state as inputs and gives the
new state back as outputs. A device that keeps no variables of its own
(``Plugin.handles_state`` False: the example ``TWOSTAGE``, ``PROCESS``, engine devices)
compiles such a model as it is, state ports included, and never sees ``STATEFUL``: the
Core wraps the device's compiled model in a :class:`StatefulCompiledModel`, which hides
the paired ports and keeps the variables in each of its requests (in the application's
process, also for ``PROCESS``):

- before the first stage of a step, the variables' current values join the request's
  inputs (read-only arrays, handed to the device without a copy);
- in the last stage, after the device published its outputs (the commit point, see
  :mod:`aioinfer.plugin.async_request`), the paired outputs become the variables' values
  and the others the step's results.

A step cancelled or failed before the end of its last stage changes no variable. The
device runs an ordinary stateless inference with its own pipeline and executors, so none
of this is device code. ``CPU`` keeps its native variables (plan inputs and outputs):
forced onto ``CPU``, the layer costs about 10 µs more per step of a small GRU or KV-cache
model, 10-20 % of such a step (``benchmarks/state_step.py``, docs/stateful.md).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from aioinfer.errors import CompileError, ExportError
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.state import (
    VariableState,
    VariableStore,
    dimension_sizes,
    split_ports,
)
from aioinfer.plugin.sync_request import SyncInferRequest
from aioinfer.properties import STATEFUL, declare, parse_config, property_name
from aioinfer.transforms.make_stateful import state_shapes, stateful_pairs

if TYPE_CHECKING:
    from aioinfer.model import Dim, Model
    from aioinfer.plugin.executors import Executor
    from aioinfer.plugin.plugin import Plugin

Stage = Callable[[], Any]

_DECLARED = declare(STATEFUL)


def compile_stateful(
    plugin: Plugin,
    model: Model,
    config: Mapping[str, Any],
    compile_on: Callable[[Plugin, Model, Mapping[str, Any]], CompiledModel] | None = None,
) -> CompiledModel:
    """Compile ``model`` on ``plugin`` (a device that does not handle state) with
    ``config`` less ``STATEFUL``, and keep the variables that ``STATEFUL`` asks for above
    the device. The pairs are resolved before the device compiles anything.

    ``compile_on(plugin, model, config)`` compiles on the device (default:
    ``plugin.compile_model``); the Core passes its model cache
    (:func:`aioinfer.cache.compile_cached`), so the device's compiled model, state ports
    included, is cached as any other, and only the variables are added above it.

    Raises:
        InvalidPropertyValueError: a bad ``STATEFUL`` (see
            :func:`aioinfer.transforms.make_stateful.stateful_pairs`).
        CompileError: the device's compiled model lacks a paired port.
        The errors of ``plugin.compile_model``.
    """
    rest = {property_name(k): v for k, v in config.items()}
    asked = parse_config({"STATEFUL": rest.pop("STATEFUL")}, _DECLARED)["STATEFUL"]
    pairs = stateful_pairs(model.ir.graph, asked or None)
    compile_on = compile_on or (lambda device, source, rest: device.compile_model(source, rest))
    target = compile_on(plugin, model, rest)
    if not pairs:
        return target
    return StatefulCompiledModel(target, pairs, state_shapes(model.ir, list(pairs)))


class StatefulCompiledModel(CompiledModel):
    """A device's compiled model whose paired state ports became variables, kept in each
    request (see the module).

    Its inputs and outputs are the target's without the paired ones; ``STATEFUL`` reads
    the pairs made; every other property, the executors and the pipeline are the
    target's. Closing it closes the target.

    Attributes:
        target: the device's compiled model, with the state ports.
        variables: the variables each request keeps, in pair order.
    """

    def __init__(
        self,
        target: CompiledModel,
        pairs: Mapping[str, str],
        shapes: Mapping[str, Sequence[Dim]],
    ) -> None:
        """``pairs``: validated ``{input name: output name}``; ``shapes``: the variables'
        shapes where the graph sizes a dimension their input leaves unknown (see
        :func:`aioinfer.transforms.make_stateful.state_shapes`)."""
        have = {p.name for p in target.inputs} | {p.name for p in target.outputs}
        missing = [name for pair in pairs.items() for name in pair if name not in have]
        if missing:
            raise CompileError(
                f"device {target.plugin.device_name!r} compiled a model without the state "
                f"port(s) {', '.join(map(repr, missing))} of STATEFUL {dict(pairs)!r}"
            )
        inputs, outputs, variables = split_ports(target.inputs, target.outputs, [*pairs.items()])
        config = {**target.config, "STATEFUL": dict(pairs)}
        super().__init__(target.plugin, target.name, inputs, outputs, config)
        self.target = target
        self.streams = target.streams
        # The target's executors run the target's pipeline; the target closes them.
        self.loop_executor = target.loop_executor
        self.callback_executor = target.callback_executor
        if hasattr(target, "task_executor"):
            self.task_executor = target.task_executor
        self.variables = [
            dataclasses.replace(v, shape=tuple(shapes.get(v.name, v.shape))) for v in variables
        ]
        produced = [p.name for p in target.outputs]
        self.result_indices = [produced.index(p.name) for p in outputs]
        """Where each output is among the target's outputs."""
        self.state_indices = [produced.index(v.output_name) for v in self.variables]
        """Where each variable's new value is among the target's outputs."""

    def create_sync_infer_request(self) -> StatefulInferRequest:
        return StatefulInferRequest(self, self.target.create_sync_infer_request())

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """The target's pipeline for the target's request, with the variables fed in
        before its first stage and taken after its last."""
        assert isinstance(request, StatefulInferRequest)
        stages = self.target.pipeline(request.target)
        return [*zip([e for e, _ in stages], request.around([s for _, s in stages]))]

    def export_model(self, stream: BinaryIO | None = None) -> bytes:
        """Raises ExportError: the variables live above the device, and a blob holds only
        what the device compiled."""
        raise ExportError(
            f"a stateful model on {self.plugin.device_name!r} cannot be exported: its "
            "variables are kept above the device; compile it again with STATEFUL"
        )

    def ready(self) -> bool:
        return super().ready() and self.target.ready()

    def max_batch_size(self) -> int | None:
        return self.target.max_batch_size()

    def batch_statistics(self) -> dict[int, int] | None:
        return self.target.batch_statistics()

    def supported_properties(self) -> tuple[str, ...]:
        names = self.target.supported_properties()
        return names if "STATEFUL" in names else (*names, "STATEFUL")

    def get_property(self, name: str) -> Any:
        """``STATEFUL`` (the pairs made) or the target's property.

        Raises:
            UnknownPropertyError: the target does not support it either.
        """
        name = property_name(name)
        if name == "STATEFUL":
            return dict(self.config["STATEFUL"])
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties()
        return self.target.get_property(name)

    async def close(self) -> None:
        """Close this model's requests (cancelling what runs), then the target."""
        await super().close()
        await self.target.close()

    def __repr__(self) -> str:
        return f"<stateful {self.target!r}>"


class StatefulInferRequest(SyncInferRequest):
    """A request of a :class:`StatefulCompiledModel`: the target device's request runs
    the step, with this request's variables fed in before its first stage and taken from
    its outputs in its last (the variables' values stay frozen arrays: the device reads
    them in place and must not write into them, as into any input).

    It shares the target request's cancel token, stage timings and ``queued_seconds``.
    """

    def __init__(self, compiled_model: StatefulCompiledModel, target: SyncInferRequest) -> None:
        self.target = target
        """The device's request, which runs the steps."""
        super().__init__(compiled_model)
        self.cancel_token = target.cancel_token
        self.stage_durations = target.stage_durations
        self.node_profile = target.node_profile
        self._input_names = [p.name for p in self.inputs]
        self._variable_names = [v.name for v in compiled_model.variables]
        self._result_indices = compiled_model.result_indices
        self._state_indices = compiled_model.state_indices
        self._variables = VariableStore(compiled_model.variables, self._state_sizes)

    def _state_sizes(self) -> dict[str, int]:
        return dimension_sizes(self.inputs, self.input_tensors)

    @property
    def queued_seconds(self) -> float:
        """The target request's (the device sets it, the async request adds to it)."""
        return self.target.queued_seconds

    @queued_seconds.setter
    def queued_seconds(self, value: float) -> None:
        self.target.queued_seconds = value

    # -- variables ------------------------------------------------------------------------

    def query_state(self, guard: Callable[[], None] | None = None) -> list[VariableState]:
        return self._variables.states(guard)

    def feed_state(self) -> None:
        """Hand this step's inputs and the variables' values to the target request."""
        target = self.target
        target.clear_inputs()
        for name, value in zip(self._input_names, self.input_tensors):
            if value is not None:
                target.set_tensor(name, value, share_inputs=True)
        for name, value in zip(self._variable_names, self._variables.feed()):
            target.set_tensor(name, value, share_inputs=True)

    def take_state(self) -> None:
        """Commit the new values the target's step produced and publish the other
        outputs (at the commit point: the target's last stage has run).

        Raises:
            InferenceError: a new value disagrees with its variable (nothing is stored).
        """
        results = self.target.results
        assert results is not None, "the device's last stage publishes the results"
        produced = results.to_tuple()
        outputs = [produced[i] for i in self._result_indices]
        self._variables.commit([_unshared(produced[i], outputs) for i in self._state_indices])
        self.set_results(outputs)
        self.target.clear_inputs()  # keeps no input of this step alive

    def around(self, stages: Sequence[Stage]) -> list[Stage]:
        """``stages`` (the target's, in order) with :meth:`feed_state` before the first and
        :meth:`take_state` after the last."""
        wrapped = list(stages)
        wrapped[0] = _before(wrapped[0], self.feed_state)
        wrapped[-1] = _after(wrapped[-1], self.take_state)
        return wrapped

    # -- stages (the synchronous path; the async one runs the target's pipeline) ---------

    def infer_preprocess(self) -> None:
        self.feed_state()
        self.target.infer_preprocess()

    def start_pipeline(self) -> None:
        self.target.start_pipeline()

    def wait_pipeline(self) -> None:
        self.target.wait_pipeline()

    def infer_postprocess(self) -> None:
        self.target.infer_postprocess()
        self.take_state()

    # -- the rest is the target's ---------------------------------------------------------

    def clear_inputs(self) -> None:
        super().clear_inputs()
        self.target.clear_inputs()

    def cancel(self) -> None:
        self.target.cancel()

    def get_profiling_info(self) -> list[dict[str, Any]]:
        return self.target.get_profiling_info()


def _before(stage: Stage, hook: Callable[[], None]) -> Stage:
    @functools.wraps(stage)
    def run() -> Any:
        hook()
        return stage()

    return run


def _after(stage: Stage, hook: Callable[[], None]) -> Stage:
    @functools.wraps(stage)
    def run() -> Any:
        result = stage()
        hook()
        return result

    return run


def _unshared(value: Any, outputs: Sequence[Any]) -> Any:
    """``value`` (a variable's new value, frozen once stored), copied when it shares
    memory with an output handed to the user."""
    if any(isinstance(o, np.ndarray) and np.may_share_memory(value, o) for o in outputs):
        return np.array(value, copy=True)
    return value
