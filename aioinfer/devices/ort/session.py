"""The onnxruntime session of an ORT compiled model: model bytes, options, errors.

The session is created from the model aioinfer read (its IR serialized to bytes), so a
model changed after reading (``Model.reshape``) runs as changed. Weights kept in external
data files stay there: onnxruntime reads them from the directory they were found in.

The intra-op threads spin (``ORT_ALLOW_SPINNING``, on by default) for at most
:data:`SPIN_US` before they sleep: a run of many kernels needs them awake between its
parallel sections (asleep, each section must wake them: 4-20 wake-ups per run of an MLP
or SqueezeNet, each tens of microseconds on a virtual machine), and back-to-back runs
need them awake between runs; onnxruntime's own default lets them spin for milliseconds
after the last run, holding a core that the event loop and other streams need.

An export holds onnxruntime's own optimized graph (:meth:`SessionSpec.optimized_model`),
saved at the ``EXTENDED`` level: fusions and constant folding, into standard and
``com.microsoft`` operators, which any machine with the same onnxruntime and providers
runs. The ``ALL`` level adds layout changes (``com.microsoft.nchwc`` operators blocked
for this CPU's vector width) that onnxruntime itself warns are tied to the machine that
made them; the imported session applies them again when it loads the graph.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import onnx_ir as ir
import onnxruntime as ort

from aioinfer.errors import (
    CompileError,
    InvalidPropertyValueError,
    UnsupportedOperatorError,
)
from aioinfer.model import Model
from aioinfer.plugin.executors import lower_thread_priority

T = TypeVar("T")

_EXTERNAL_DATA_DIR = "session.model_external_initializers_file_folder_path"
SPINNING_ENTRIES = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")
SPIN_DURATION = "session.intra_op.spin_duration_us"
SPIN_US = 200
"""How long an idle intra-op thread spins before it sleeps, in microseconds: longer than
the gaps between the parallel sections of a run and between back-to-back runs, short
enough that nothing spins once the requests stop. Measured (2-core Xeon, onnxruntime
1.32): the CPU time onnxruntime burnt in the 100 ms after a run of an MLP was 0.04 ms
with 200 us, 4.6 ms with 1000 us and 8.8 ms with its default."""
_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
TERMINATED = "terminate flag"
"""In onnxruntime's message when a run stopped because ``RunOptions.terminate`` was set."""


@dataclass(frozen=True)
class ModelBytes:
    """A model as onnxruntime reads it: serialized, with the directory of its external
    weights ('' when all are inside)."""

    name: str
    model: bytes
    external_data_dir: str = ""

    @classmethod
    def from_model(cls, model: Model) -> ModelBytes:
        """The bytes of the model aioinfer read (as changed since, by ``reshape``)."""
        return cls(
            name=model.name,
            model=ir.serde.serialize_model(model.ir).SerializeToString(),
            external_data_dir=external_data_dir(model.ir),
        )


@dataclass(frozen=True)
class SessionSpec:
    """Everything needed to create (and, for profiling, re-create) the session."""

    source: ModelBytes
    providers: tuple[str, ...]
    intra_op_threads: int
    allow_spinning: bool
    cpu_mem_arena: bool = True
    """``ORT_CPU_MEM_ARENA``: the session keeps its runs' memory in its arena."""
    profile_prefix: str = ""
    """Where onnxruntime writes the profile ('' when profiling is off)."""
    nice: int = 0
    """``ORT_THREAD_NICE``: the session is created on a thread of that priority, whose
    intra-op pool threads inherit it."""

    @classmethod
    def from_config(
        cls,
        source: ModelBytes,
        config: Mapping[str, Any],
        intra_op_threads: int,
        profile_prefix: str = "",
    ) -> SessionSpec:
        """The spec for ``source`` compiled with the parsed ``config``.

        Raises:
            InvalidPropertyValueError: a provider in ``ORT_PROVIDERS`` is not available.
        """
        return cls(
            source=source,
            providers=check_providers(config),
            intra_op_threads=intra_op_threads,
            allow_spinning=bool(config["ORT_ALLOW_SPINNING"]),
            cpu_mem_arena=bool(config["ORT_CPU_MEM_ARENA"]),
            profile_prefix=profile_prefix,
            nice=int(config["ORT_THREAD_NICE"]),
        )

    def options(self) -> ort.SessionOptions:
        """The session options: threads, spinning, the arena, external data, profiling."""
        options = ort.SessionOptions()
        options.enable_cpu_mem_arena = self.cpu_mem_arena
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        spinning = "1" if self.allow_spinning else "0"
        for entry in SPINNING_ENTRIES:
            options.add_session_config_entry(entry, spinning)
        if self.allow_spinning:  # not for milliseconds after a run (see the module)
            options.add_session_config_entry(SPIN_DURATION, str(SPIN_US))
        if self.source.external_data_dir:
            options.add_session_config_entry(_EXTERNAL_DATA_DIR, self.source.external_data_dir)
        if self.profile_prefix:
            options.enable_profiling = True
            options.profile_file_prefix = self.profile_prefix
        return options

    def create(self) -> ort.InferenceSession:
        """A new session (with ``nice``: created on a thread of lower priority).

        Raises:
            UnsupportedOperatorError: onnxruntime has no kernel for a node (named).
            CompileError: onnxruntime refused the model for another reason.
        """
        if self.nice:
            return _on_thread_of_priority(self.nice, self._create)
        return self._create()

    def _create(self) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(self.source.model, self.options(), providers=self.providers)
        except Exception as exc:  # onnxruntime's own exception classes
            message = f"onnxruntime cannot load model {self.source.name!r}: {ort_message(exc)}"
            if type(exc).__name__ == "NotImplemented":
                raise UnsupportedOperatorError(message) from None
            raise CompileError(message) from None

    def optimized_model(self) -> bytes:
        """The model as onnxruntime optimizes it for these providers at the ``EXTENDED``
        level (see the module docstring), with every weight inside: what an export
        holds. Creates a session of its own (one intra-op thread, no profiling).

        Raises:
            CompileError: onnxruntime refused the model (it did not when compiling).
        """
        with tempfile.TemporaryDirectory(prefix="aioinfer-ort-export-") as directory:
            options = replace(self, intra_op_threads=1, profile_prefix="").options()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            options.optimized_model_filepath = os.path.join(directory, "optimized.onnx")
            try:
                ort.InferenceSession(self.source.model, options, providers=self.providers)
            except Exception as exc:  # onnxruntime's own exception classes
                raise CompileError(
                    f"onnxruntime cannot optimize model {self.source.name!r}: {ort_message(exc)}"
                ) from None
            with open(options.optimized_model_filepath, "rb") as file:
                return file.read()


def _on_thread_of_priority(nice: int, create: Callable[[], T]) -> T:
    """``create()`` on a new thread whose priority is lowered by ``nice`` (what the
    threads ``create`` starts inherit); its exception is raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            lower_thread_priority(nice)
            result.append(create())
        except BaseException as exc:  # raised on the calling thread
            error.append(exc)

    thread = threading.Thread(target=run, name="aioinfer-ort-session")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def check_providers(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The providers of ``ORT_PROVIDERS`` in the parsed ``config``.

    Raises:
        InvalidPropertyValueError: one is not available in this onnxruntime.
    """
    providers = tuple(config["ORT_PROVIDERS"])
    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise InvalidPropertyValueError(
            f"invalid value {list(providers)!r} for property 'ORT_PROVIDERS': "
            f"{', '.join(map(repr, missing))} not available; this onnxruntime has "
            f"{', '.join(map(repr, available))}"
        )
    return providers


def external_data_dir(model: ir.Model) -> str:
    """The directory of the model's external weights ('' when all are in memory)."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                return str(value.const_value.base_dir)
    return ""


def ort_message(exc: BaseException) -> str:
    """onnxruntime's message without its ``[ONNXRuntimeError] : 1 : FAIL :`` prefix."""
    return _PREFIX.sub("", str(exc)).strip()
