"""The open plugin API: a device is written without editing aioinfer.

``COLOUR`` is the CPU device plus a property of its own, declared in this module (as a
third-party package would declare it in its own). ``NEGATE`` is an engine-like device
with no graph and no threads of its own: its compute is a coroutine (where an engine
would await its own threads), its export payload is a few bytes of its own, and the
Core's model cache keeps it without the device knowing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.devices.cpu.plugin import CPUPlugin
from aioinfer.model import Model
from aioinfer.plugin import AwaitExecutor, CompiledModel, Executor, Plugin, SyncInferRequest
from aioinfer.plugin.blob import ExportedModel
from aioinfer.properties import (
    ALLOW_AUTO_BATCHING,
    CACHE_DIR,
    DEVICE_NAME,
    LOADED_FROM_CACHE,
    NETWORK_NAME,
    OPTIMAL_NUMBER_OF_INFER_REQUESTS,
    PERFORMANCE_HINT,
    SUPPORTED_PROPERTIES,
    Property,
    choice,
    declare,
    positive_float,
)
from tests.helpers import make_model, mlp_model, tensor_info

MLP = mlp_model()
X = np.ones((2, 4), np.float32)

COLOUR = Property(
    "COLOUR", "A setting of this device alone.", default="RED", parse=choice("RED", "BLUE")
)


class ColourPlugin(CPUPlugin):
    """The CPU device, with a property of its own."""

    device_name = "COLOUR"
    properties = declare(*CPUPlugin.properties.values(), COLOUR)


@pytest.fixture
def core() -> ai.Core:
    core = ai.Core()
    core.register_plugin(ColourPlugin())
    return core


def test_a_device_declares_a_property_of_its_own(core: ai.Core) -> None:
    compiled = core.compile_model(MLP, "COLOUR", {"COLOUR": "blue"})
    assert compiled.get_property("COLOUR") == "BLUE"
    assert "COLOUR" in compiled.get_property("SUPPORTED_PROPERTIES")
    assert core.compile_model(MLP, "COLOUR").get_property("COLOUR") == "RED"  # the default
    assert core.get_property("COLOUR", "COLOUR") == "RED"
    with pytest.raises(ai.InvalidPropertyValueError, match="'GREEN' for property 'COLOUR'"):
        core.compile_model(MLP, "COLOUR", {"COLOUR": "GREEN"})
    # Another device does not know it.
    with pytest.raises(ai.UnknownPropertyError, match="'COLOUR'"):
        core.compile_model(MLP, "CPU", {"COLOUR": "BLUE"})
    assert "COLOUR" not in core.get_property("CPU", "SUPPORTED_PROPERTIES")


def test_core_settings_take_a_property_a_device_declares(core: ai.Core) -> None:
    core.set_property({"COLOUR": "BLUE"})  # for every device: the one that declares it
    assert core.get_property("COLOUR") == "BLUE"
    assert core.compile_model(MLP, "COLOUR").get_property("COLOUR") == "BLUE"
    assert core.compile_model(MLP, "CPU").get_property("DEVICE_NAME") == "CPU"  # unaffected
    core.set_property("COLOUR", {"COLOUR": "RED"})
    assert core.compile_model(MLP, "COLOUR").get_property("COLOUR") == "RED"
    with pytest.raises(ai.InvalidPropertyValueError, match="COLOUR"):
        core.set_property({"COLOUR": 7})


def test_device_properties_live_with_their_device() -> None:
    core = ai.Core()
    cpu = set(core.get_property("CPU", "SUPPORTED_PROPERTIES"))
    assert {
        "MAX_BATCH_SIZE",
        "BATCH_TIMEOUT_MS",
        "WORKER_TIMEOUT_S",
        "TARGET_DEVICE",
    } & cpu == set()
    assert {"ACTIVATION_MEMORY_BYTES", "ALLOW_AUTO_BATCHING"} <= cpu
    assert "MAX_BATCH_SIZE" in core.get_property("BATCH", "SUPPORTED_PROPERTIES")
    assert "WORKER_TIMEOUT_S" in core.get_property("PROCESS", "SUPPORTED_PROPERTIES")


def test_import_refuses_properties_fixed_by_the_compile() -> None:
    """Only properties declared mutable may be given again at import (the others would be
    silently ignored: the blob holds what the compile made of them)."""
    core = ai.Core()
    blob = core.compile_model(MLP, "CPU").export_model()
    for fixed in ({"STATEFUL": {}}, {"ALLOW_AUTO_BATCHING": False}):
        (name,) = fixed
        with pytest.raises(ai.InvalidPropertyValueError, match=f"{name} cannot be set when"):
            core.import_model(blob, "CPU", fixed)
    imported = core.import_model(blob, "CPU", {"NUM_STREAMS": 2, "PERF_COUNT": True})
    assert imported.get_property("NUM_STREAMS") == 2
    assert imported.create_infer_request().infer_sync({"x": X})


# -- an engine-like device: no graph, no threads, a payload of its own -------------------

SCALE = Property("SCALE", "NEGATE: the factor of the negation.", default=1.0, parse=positive_float)


NEG = make_model(
    [oh.make_node("Neg", ["x"], ["y"])],
    [tensor_info("x", np.float32, ["batch", 4])],
    [tensor_info("y", np.float32, ["batch", 4])],
    name="neg",
)


class NegatePlugin(Plugin):
    """Runs a one-input, one-output model as ``y = -SCALE * x``, in a coroutine."""

    device_name = "NEGATE"
    properties = declare(
        SCALE,
        PERFORMANCE_HINT,
        ALLOW_AUTO_BATCHING,
        CACHE_DIR,
        LOADED_FROM_CACHE,
        NETWORK_NAME,
        OPTIMAL_NUMBER_OF_INFER_REQUESTS,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
    )

    def __init__(self) -> None:
        self.compiles = 0

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> NegateCompiledModel:
        self.compiles += 1
        parsed = self.parse_config(config)
        return NegateCompiledModel(self, model.name, model.inputs, model.outputs, parsed)

    def import_payload(self, exported: ExportedModel, config: dict[str, Any]) -> CompiledModel:
        kind, _, name = bytes(exported.payload).decode(errors="replace").partition(":")
        if kind != "negate":
            raise ai.InvalidBlobError(f"not a NEGATE payload: {bytes(exported.payload)!r}")
        return NegateCompiledModel(self, name, exported.inputs, exported.outputs, config)

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        return {node.name or "negate": self.device_name for node in model.ir.graph}


class NegateCompiledModel(CompiledModel):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.await_executor = self.add_executor(AwaitExecutor())

    def create_sync_infer_request(self) -> NegateRequest:
        return NegateRequest(self)

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        assert isinstance(request, NegateRequest)
        return [
            (self.loop_executor, request.infer_preprocess),
            (self.await_executor, request.compute),
            (self.loop_executor, request.wait_pipeline),
            (self.loop_executor, request.infer_postprocess),
        ]

    def export_payload(self) -> bytes:
        return f"negate:{self.name}".encode()


class NegateRequest(SyncInferRequest):
    def __init__(self, compiled_model: NegateCompiledModel) -> None:
        super().__init__(compiled_model)
        self._scale = float(compiled_model.config["SCALE"])
        self._outputs: list[np.ndarray] = []

    async def compute(self) -> None:
        await anyio.sleep(0)  # where an engine would await its own threads
        self.start_pipeline()

    def start_pipeline(self) -> None:
        self._outputs = [-self._scale * np.asarray(self.input_tensors[0])]

    def infer_postprocess(self) -> None:
        outputs, self._outputs = self._outputs, []
        self.set_results(outputs)


@pytest.fixture
def negate() -> tuple[ai.Core, NegatePlugin]:
    core = ai.Core()
    plugin = NegatePlugin()
    core.register_plugin(plugin)
    return core, plugin


@pytest.mark.anyio
async def test_an_engine_device_needs_no_graph_and_no_threads(
    negate: tuple[ai.Core, NegatePlugin],
) -> None:
    core, _ = negate
    before = {t.name for t in threading.enumerate()}
    compiled = core.compile_model(NEG, "NEGATE", {"SCALE": 2})
    async with compiled.create_infer_request() as request:
        results = await request.infer({"x": X})
    np.testing.assert_array_equal(results[0], -2 * X)
    np.testing.assert_array_equal((await compiled.infer({"x": X}))[0], -2 * X)
    assert compiled.get_property("NETWORK_NAME") == "neg"
    assert compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 1
    assert compiled.streams == 1
    await compiled.close()
    started = {t.name for t in threading.enumerate()} - before
    assert not any("NEGATE" in name for name in started), started


def test_the_core_caches_any_device_that_exports(
    negate: tuple[ai.Core, NegatePlugin], tmp_path: Path
) -> None:
    core, plugin = negate
    config = {"CACHE_DIR": str(tmp_path), "SCALE": 3}
    first = core.compile_model(NEG, "NEGATE", config)
    assert first.get_property("LOADED_FROM_CACHE") is False
    (entry,) = tmp_path.iterdir()
    assert entry.read_bytes() == first.export_model()
    second = core.compile_model(NEG, "NEGATE", config)
    assert second.get_property("LOADED_FROM_CACHE") is True
    assert plugin.compiles == 1
    assert second.get_property("SCALE") == 3.0
    y = second.create_infer_request().infer_sync({"x": X})[0]
    np.testing.assert_array_equal(y, -3 * X)
    # Another config is another entry; a broken entry is compiled again and replaced.
    core.compile_model(NEG, "NEGATE", {**config, "SCALE": 4})
    assert plugin.compiles == 2 and len(list(tmp_path.iterdir())) == 2
    good = entry.read_bytes()
    entry.write_bytes(good.replace(b"negate:", b"broken:"))  # checksum mismatch
    assert core.compile_model(NEG, "NEGATE", config).get_property("LOADED_FROM_CACHE") is False
    assert plugin.compiles == 3 and entry.read_bytes() == good


def test_a_device_payload_goes_into_the_shared_framing(
    negate: tuple[ai.Core, NegatePlugin],
) -> None:
    core, _ = negate
    blob = core.compile_model(NEG, "NEGATE", {"SCALE": 5}).export_model()
    assert blob.startswith(b"AIOINFER")
    imported = core.import_model(blob, "NEGATE")
    assert imported.get_property("SCALE") == 5.0
    assert imported.get_property("NETWORK_NAME") == "neg"
    with pytest.raises(ai.BlobDeviceError, match="'NEGATE', not 'CPU'"):
        core.import_model(blob, "CPU")
    with pytest.raises(ai.InvalidBlobError, match="checksum"):
        core.import_model(blob[:-1] + bytes([blob[-1] ^ 1]), "NEGATE")
    with pytest.raises(ai.InvalidPropertyValueError, match="SCALE cannot be set when importing"):
        core.import_model(blob, "NEGATE", {"SCALE": 1})


# -- virtual devices and the Core ask devices through generic methods --------------------


def test_a_virtual_device_answers_query_model_for_its_target(
    negate: tuple[ai.Core, NegatePlugin],
) -> None:
    core, _ = negate
    assert core.query_model(NEG, "NEGATE") == {"negate": "NEGATE"}
    assert core.query_model(NEG, "BATCH:NEGATE") == {"negate": "BATCH"}
    assert core.query_model(NEG, "PROCESS:NEGATE") == {"negate": "PROCESS"}
    assert core.query_model(NEG, "BATCH:PROCESS:NEGATE") == {"negate": "BATCH"}
    assert core.query_model(NEG, "BATCH", {"TARGET_DEVICE": "NEGATE"}) == {"negate": "BATCH"}
    with pytest.raises(ai.UnknownDeviceError, match="'NEGATE' takes no target"):
        core.query_model(NEG, "NEGATE:CPU")


def test_the_core_batches_any_device_that_opts_in(negate: tuple[ai.Core, NegatePlugin]) -> None:
    core, _ = negate
    compiled = core.compile_model(NEG, "NEGATE", {"PERFORMANCE_HINT": "THROUGHPUT", "SCALE": 2})
    assert compiled.get_property("DEVICE_NAME") == "BATCH:NEGATE"
    assert compiled.get_property("SCALE") == 2.0  # the target's property
    y = compiled.create_infer_request().infer_sync({"x": X})[0]
    np.testing.assert_array_equal(y, -2 * X)
    alone = core.compile_model(
        NEG, "NEGATE", {"PERFORMANCE_HINT": "THROUGHPUT", "ALLOW_AUTO_BATCHING": False}
    )
    assert alone.get_property("DEVICE_NAME") == "NEGATE"


@pytest.mark.anyio
async def test_every_compiled_model_says_whether_it_batches() -> None:
    """What a server needs to size its admission and count executions, without testing
    for a device class."""
    core = ai.Core()
    cpu = core.compile_model(MLP, "CPU", {"NUM_STREAMS": 2})
    assert cpu.max_batch_size() is None and cpu.batch_statistics() is None
    batched = core.compile_model(MLP, "BATCH:CPU", {"NUM_STREAMS": 2, "MAX_BATCH_SIZE": 8})
    assert batched.max_batch_size() == 8
    assert batched.streams == 2  # the target's
    await batched.infer({"x": X})
    assert batched.batch_statistics() == {2: 1}  # one batch of X's two rows
    await batched.close()
