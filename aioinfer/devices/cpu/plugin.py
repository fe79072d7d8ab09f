"""The CPU device: numpy kernels behind the plugin API."""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import onnx_ir as ir

from aioinfer import __version__
from aioinfer.devices.cpu import kernels  # noqa: F401  (registers every kernel)
from aioinfer.devices.cpu.compiler import evaluate_node, lower
from aioinfer.devices.cpu.export import Exported, cache_key, dump, load
from aioinfer.devices.cpu.kernels.parallel import set_intra_op_threads
from aioinfer.devices.cpu.kernels.registry import find_kernel
from aioinfer.devices.cpu.request import CPUInferRequest
from aioinfer.errors import (
    AioinferError,
    ImportModelError,
    InvalidBlobError,
    InvalidPropertyValueError,
    PropertyError,
    UnsupportedOperatorError,
)
from aioinfer.model import Model, Port
from aioinfer.opsets import MAX_ONNX_OPSET, check_onnx_opset, node_opset
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.plugin import Plugin
from aioinfer.plugin.state import split_ports
from aioinfer.properties import cpu_model_name, num_cores, parse_config
from aioinfer.transforms.make_stateful import stateful_pairs, variable_shapes
from aioinfer.transforms.pipelines import compile_passes


class CPUPlugin(Plugin):
    """The built-in ``"CPU"`` device."""

    device_name = "CPU"
    handles_state = True  # variables are inputs and outputs of the plan: see docs/stateful.md
    supported_properties = (
        "PERFORMANCE_HINT",
        "NUM_STREAMS",
        "INFERENCE_NUM_THREADS",
        "ALLOW_AUTO_BATCHING",
        "STATEFUL",
        "PERF_COUNT",
        "CACHE_DIR",
        "ACTIVATION_MEMORY_BYTES",
        "LOADED_FROM_CACHE",
        "NETWORK_NAME",
        "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
        "SUPPORTED_PROPERTIES",
        "DEVICE_NAME",
        "FULL_DEVICE_NAME",
        "NUM_CORES",
    )

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> CPUCompiledModel:
        """Compile ``model``; with ``CACHE_DIR``, load it from the cache when it was
        compiled before with the same device, config and aioinfer version (else compile
        and store it there). An entry that cannot be imported (damaged, of another
        version or device, of another model, or not self-contained) is compiled again
        and replaced.

        Raises:
            UnsupportedOpsetError: the model's ``ai.onnx`` opset is newer than
                :data:`~aioinfer.opsets.MAX_ONNX_OPSET`.
        """
        parsed = parse_config(config, self.supported_properties)
        check_onnx_opset(model.ir.opset_imports, self.device_name, MAX_ONNX_OPSET)
        cache_dir = parsed["CACHE_DIR"]
        if not cache_dir:
            return CPUCompiledModel.compile(self, model, parsed)
        path = Path(cache_dir) / f"{cache_key(model, self.device_name, parsed)}.blob"
        if path.is_file():
            try:
                cached = self._from_blob(path.read_bytes(), parsed, set(config), model)
            except (ImportModelError, OSError):
                pass  # an entry that cannot be used is compiled again and replaced below
            else:
                cached.loaded_from_cache = True
                return cached
        compiled = CPUCompiledModel.compile(self, model, parsed)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_bytes(compiled.export_model())
        os.replace(partial, path)  # atomic: a concurrent reader sees all or nothing
        return compiled

    def import_model(
        self, blob: bytes, config: Mapping[str, Any] | None = None
    ) -> CPUCompiledModel:
        """A compiled model from ``blob`` (see :meth:`CPUCompiledModel.export_model`);
        ``config`` may change run-time properties (hint, streams, threads, PERF_COUNT).

        The config stored in the blob is validated like a compile config, but a bad one
        is the blob's fault: it raises ``InvalidBlobError``, not a property error.

        Raises:
            InvalidBlobError, BlobVersionError, BlobDeviceError: see
                :func:`aioinfer.devices.cpu.export.load`; also a config in the blob that
                this device does not accept, or a model that cannot be lowered.
            InvalidPropertyValueError: ``STATEFUL`` given (the graph is already transformed).
            UnknownPropertyError: a bad ``config``.
        """
        config = dict(config or {})
        if "STATEFUL" in config:
            raise InvalidPropertyValueError(
                "STATEFUL cannot be set when importing: the exported model keeps the "
                "variables it was compiled with"
            )
        return self._from_blob(blob, parse_config(config, self.supported_properties), set(config))

    def _from_blob(
        self, blob: bytes, parsed: dict[str, Any], given: set[str], source: Model | None = None
    ) -> CPUCompiledModel:
        """Import ``blob`` with the ``given`` names of the ``parsed`` config overriding
        its own; ``source``: the model a cache entry must be of (same ports)."""
        exported = load(blob, self.device_name)
        if source is not None and (exported.inputs, exported.outputs) != (
            source.inputs,
            source.outputs,
        ):
            raise InvalidBlobError("the cached blob holds another model: its ports differ")
        try:
            stored = parse_config(exported.config, self.supported_properties)
        except PropertyError as exc:
            raise InvalidBlobError(f"the blob's config is not valid: {exc}") from None
        if not isinstance(stored["STATEFUL"], dict):
            raise InvalidBlobError(
                f"the blob's config has STATEFUL {stored['STATEFUL']!r}, expected the "
                "pairs made when it was compiled"
            )
        config = {**stored, "CACHE_DIR": parsed["CACHE_DIR"]}
        # STATEFUL stays as stored: the pairs made (a cache entry's config asked for them).
        config.update({n: parsed[n] for n in given if n in parsed and n != "STATEFUL"})
        try:
            compiled = CPUCompiledModel(
                self, exported.model, exported.inputs, exported.outputs, config
            )
        except (AioinferError, LookupError, ValueError, TypeError, RecursionError) as exc:
            raise InvalidBlobError(f"the blob's model cannot be lowered: {exc}") from exc
        if compiled.config["STATEFUL"] != stored["STATEFUL"]:
            raise InvalidBlobError(
                f"the blob's config has STATEFUL {stored['STATEFUL']!r}, but its model "
                f"makes the variables {compiled.config['STATEFUL']!r}"
            )
        graph = exported.model.graph
        feeds = [v.name for v in graph.inputs if v.name not in graph.initializers]
        outputs = [v.name for v in graph.outputs]
        if [p.name for p in compiled.inputs] != feeds or [
            p.name for p in compiled.outputs
        ] != outputs:
            raise InvalidBlobError(
                f"the blob's header ports do not match its model: inputs "
                f"{[p.name for p in compiled.inputs]} and outputs "
                f"{[p.name for p in compiled.outputs]}, the model has {feeds} and {outputs}"
            )
        return compiled

    def get_property(self, name: str) -> Any:
        """The device-level properties; ``FULL_DEVICE_NAME`` is the processor's model name."""
        if name == "FULL_DEVICE_NAME":
            return cpu_model_name()
        return super().get_property(name)

    def query_model(self, model: Model) -> dict[str, str]:
        opsets = model.ir.opset_imports
        supported = {}
        for index, node in enumerate(model.ir.graph):
            try:
                find_kernel(node.domain, node.op_type, node_opset(node, opsets))
            except UnsupportedOperatorError:
                continue
            supported[node.name or f"{node.op_type}_{index}"] = self.device_name
        return supported


class CPUCompiledModel(CompiledModel):
    """A model lowered to a plan of numpy kernels; weights are shared by all requests.

    With ``STATEFUL`` pairs, ``variables`` lists the variables each request keeps (their
    inputs and outputs are no longer ports), and the config holds the pairs made.
    """

    def __init__(
        self,
        plugin: CPUPlugin,
        ir_model: ir.Model,
        source_inputs: Sequence[Port],
        source_outputs: Sequence[Port],
        config: dict[str, Any],
    ) -> None:
        """Lower the *transformed* ``ir_model`` (see :meth:`compile`); ``source_inputs``
        and ``source_outputs`` are the ports of the model before make-stateful, and
        ``config["STATEFUL"]`` the pairs it made."""
        self.ir_model = ir_model
        self.source_ports = (list(source_inputs), list(source_outputs))
        self.plan = lower(ir_model.graph, ir_model.opset_imports)
        pairs = config.get("STATEFUL") or {}
        made = [(name, pairs[name]) for name in self.plan.variables]
        inputs, outputs, variables = split_ports(source_inputs, source_outputs, made)
        shapes = variable_shapes(ir_model.graph)  # with the sizes SizeStatesPass found
        self.variables = [
            dataclasses.replace(v, shape=shapes.get(v.name, v.shape)) for v in variables
        ]
        config = {**config, "STATEFUL": dict(made)}
        streams = _streams(config)
        self.threads_per_stream = _configure_blas(config, streams)
        self.loaded_from_cache = False
        self._sync_requests: weakref.WeakSet[CPUInferRequest] = weakref.WeakSet()
        super().__init__(plugin, ir_model.graph, inputs, outputs, config, streams)

    @classmethod
    def compile(cls, plugin: CPUPlugin, model: Model, config: dict[str, Any]) -> CPUCompiledModel:
        """Run the pass pipeline on a copy of ``model``, then lower it."""
        ir_model = model.ir.clone()
        pairs = stateful_pairs(ir_model.graph, config.get("STATEFUL"))
        compile_passes(evaluate_node, pairs)(ir_model)
        return cls(plugin, ir_model, model.inputs, model.outputs, {**config, "STATEFUL": pairs})

    def export_model(self, stream: BinaryIO | None = None) -> bytes:
        exported = Exported(
            device=self.plugin.device_name,
            aioinfer_version=__version__,
            config={k: v for k, v in self.config.items() if k != "CACHE_DIR"},
            inputs=self.source_ports[0],
            outputs=self.source_ports[1],
            model=self.ir_model,
        )
        blob = dump(exported)
        if stream is not None:
            stream.write(blob)
        return blob

    def create_sync_infer_request(self) -> CPUInferRequest:
        request = CPUInferRequest(self)
        self._sync_requests.add(request)
        return request

    def read_only_property(self, name: str) -> Any:
        if name == "INFERENCE_NUM_THREADS":
            return self.threads_per_stream * self.streams
        if name == "ACTIVATION_MEMORY_BYTES":
            return max((r.memory.nbytes for r in list(self._sync_requests)), default=0)
        if name == "LOADED_FROM_CACHE":
            return self.loaded_from_cache
        return super().read_only_property(name)


def _configure_blas(config: Mapping[str, Any], streams: int) -> int:
    """Split the compute threads between the streams; return the threads per stream.

    Kernels split their work between that many intra-op threads, BLAS runs on one (see
    :mod:`aioinfer.devices.cpu.kernels.parallel`). Like BLAS settings this is
    process-wide, so the most recently compiled model sets it.
    """
    total = int(config["INFERENCE_NUM_THREADS"]) or num_cores()
    per_stream = max(1, total // streams)
    set_intra_op_threads(per_stream)
    return per_stream


def _streams(config: Mapping[str, Any]) -> int:
    if config["NUM_STREAMS"] != "AUTO":
        return int(config["NUM_STREAMS"])
    if config["PERFORMANCE_HINT"] == "THROUGHPUT":
        return max(1, num_cores())
    return 1
