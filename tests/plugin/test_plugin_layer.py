"""The plugin API as a layer of its own: what devices read of the request base class,
the hook a pool of requests uses, the names that moved into the layer (still found where
they were), and no reach into the request base class's private fields from above it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.model import Model
from aioinfer.plugin import PluginCore, QueueEngine, SyncInferRequest, VirtualPlugin
from aioinfer.plugin.blob import load
from aioinfer.testing.models import mlp_model, two_input_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_request_base_class_gives_the_stages_its_ports_and_inputs(core) -> None:
    compiled = core.compile_model(two_input_model(), "CPU")
    request = compiled.create_sync_infer_request()
    assert isinstance(request, SyncInferRequest)
    assert request.inputs == compiled.inputs and request.outputs == compiled.outputs
    assert [p.name for p in request.inputs] == ["a", "b", "scale"]
    assert request.input_tensors == [None, None, None]
    a = np.ones((2, 3), np.float32)
    scale = np.array([1, 2, 3], np.int64)
    request.set_tensor("a", a)
    request.set_tensor("scale", scale, share_inputs=True)
    given = request.input_tensors
    assert given[0] is not a and np.array_equal(given[0], a)  # the request's own copy
    assert given[1] is None and given[2] is scale
    request.clear_inputs()
    assert request.input_tensors == [None, None, None]
    for name in ("inputs", "outputs", "input_tensors"):  # read-only: set_tensor sets
        with pytest.raises(AttributeError):
            setattr(request, name, [])


@pytest.mark.anyio
async def test_the_idle_callback_runs_after_the_callback_once_the_request_is_idle(core):
    compiled = core.compile_model(mlp_model(), "CPU")
    request = compiled.create_infer_request()
    seen: list[tuple[str, ai.RequestState]] = []
    request.set_callback(lambda r, _: seen.append(("callback", r.state)))
    request.set_idle_callback(lambda: seen.append(("idle", request.state)))
    x = np.ones((2, 4), np.float32)
    await request.infer(x)
    request.start_async(x)
    await request.wait()
    assert seen == [("callback", ai.RequestState.BUSY), ("idle", ai.RequestState.IDLE)] * 2
    seen.clear()
    with pytest.raises(ai.InputTypeError):  # refused before it starts: nothing settles
        await request.infer(x.astype(np.int64))
    assert seen == []
    request.clear_inputs()
    with pytest.raises(ai.MissingInputError):  # failed in a stage: it settles
        await request.infer()
    assert seen == [("callback", ai.RequestState.BUSY), ("idle", ai.RequestState.IDLE)]
    seen.clear()
    request.set_idle_callback(None)
    await request.infer(x)
    assert seen == [("callback", ai.RequestState.BUSY)]
    await compiled.close()


@pytest.mark.anyio
async def test_a_callback_error_reaches_the_queue_once_and_stays_with_its_request(core):
    compiled = core.compile_model(mlp_model(), "CPU")
    queue = ai.AsyncInferQueue(compiled, 2)

    def fail(request: ai.AsyncInferRequest, userdata: int) -> None:
        if userdata == 1:
            raise KeyError(userdata)

    queue.set_callback(fail)
    x = np.ones((1, 4), np.float32)
    await queue.start_async(x, 0)
    await queue.start_async(x, 1)
    with pytest.raises(KeyError):
        await queue.wait_all()
    await queue.wait_all()  # raised once
    failed = [request for request, userdata in zip(queue, queue.userdata) if userdata == 1]
    with pytest.raises(KeyError):
        await failed[0].wait()  # the request keeps it until its next job
    await queue.close()
    await compiled.close()


def test_names_moved_into_the_plugin_layer_are_found_where_they_were() -> None:
    import aioinfer._version as version
    import aioinfer.devices.batch.properties as batch_properties
    import aioinfer.model as model
    import aioinfer.plugin.queue_engine as queue_engine
    import aioinfer.plugin.sync_request as sync_request
    import aioinfer.properties as properties
    import aioinfer.queue as queue

    assert queue.QueueEngine is queue_engine.QueueEngine is QueueEngine
    assert queue.QueueErrors is queue_engine.QueueErrors
    with pytest.warns(DeprecationWarning, match="aioinfer.properties.ALLOW_AUTO_BATCHING"):
        assert batch_properties.ALLOW_AUTO_BATCHING is properties.ALLOW_AUTO_BATCHING
    assert ai.__version__ == version.__version__
    assert sync_request.Inputs is model.Inputs  # the alias every layer's signatures use


def test_blobs_carry_the_packages_version(core) -> None:
    compiled = core.compile_model(mlp_model(), "CPU")
    assert load(compiled.export_model(), "CPU").aioinfer_version == ai.__version__


def test_a_virtual_device_compiles_through_the_core_it_is_given() -> None:
    """A virtual device written against ``PluginCore`` (not the Core class): the Core
    that registers it hands itself over, and the target compiles there."""

    class Mirror(VirtualPlugin):
        device_name = "MIRROR"

        def compile_model(self, model: Model, config: dict) -> ai.CompiledModel:
            own, rest = self.split_config(config)
            given: PluginCore = self.core
            return given.compile_model(model, own["TARGET_DEVICE"], rest, auto_batching=False)

    core = ai.Core()
    core.register_plugin(Mirror())
    compiled = core.compile_model(mlp_model(), "MIRROR:CPU")
    assert compiled.get_property("DEVICE_NAME") == "CPU"
    assert core.query_model(mlp_model(), "MIRROR:CPU") == dict.fromkeys(
        core.query_model(mlp_model(), "CPU"), "MIRROR"
    )


BASE_REQUEST_FIELDS = {"_inputs", "_input_ports", "_output_ports", "_on_idle", "_callback_error"}
"""The request base classes' own fields (``SyncInferRequest``, ``AsyncInferRequest``):
what devices and the queue read through accessors and hooks instead."""


def _fields_read(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        (node.attr, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in BASE_REQUEST_FIELDS
    }


def test_nothing_above_the_request_base_classes_reads_their_private_fields() -> None:
    """Devices (and the example device third parties copy) and the queue use the public
    accessors (``inputs``, ``outputs``, ``input_tensors``) and hook
    (``set_idle_callback``); only the two base classes' own modules name these fields."""
    own = {ROOT / "aioinfer" / "plugin" / name for name in ("sync_request.py", "async_request.py")}
    users = [
        *sorted((ROOT / "aioinfer" / "devices").rglob("*.py")),
        *sorted((ROOT / "examples" / "custom_device").rglob("*.py")),
        ROOT / "aioinfer" / "queue.py",
        ROOT / "aioinfer" / "plugin" / "stateful.py",
    ]
    assert len(users) > 40 and not own & set(users)
    found = {
        f"{path.relative_to(ROOT)}:{line} {field}"
        for path in users
        for field, line in _fields_read(path)
    }
    assert not found, sorted(found)
