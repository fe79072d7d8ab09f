"""Export and import on each device: the imported model computes the same, keeps its
config unless told otherwise, and a blob for another device is refused by name."""

from __future__ import annotations

import io

import numpy as np
import pytest

import aioinfer as ai
from tests.behaviour.conftest import DEVICES
from tests.helpers import reference_outputs

pytestmark = pytest.mark.anyio

NO_EXPORT = ("OPENVINO",)
"""Devices that do not export yet: their export_model raises ExportError."""


@pytest.fixture(autouse=True)
def exporting(device, mlp):
    if device in NO_EXPORT:
        with pytest.raises(ai.ExportError, match=device):
            mlp[1].export_model()
        pytest.skip(f"{device} does not export compiled models yet")


async def test_export_then_import_computes_the_same(core, device, mlp):
    model, _ = mlp
    compiled = core.compile_model(model, device, {"NUM_STREAMS": 2})
    stream = io.BytesIO()
    blob = compiled.export_model(stream)
    assert stream.getvalue() == blob
    imported = core.import_model(blob, device)
    assert [str(p) for p in imported.inputs] == [str(p) for p in compiled.inputs]
    assert [str(p) for p in imported.outputs] == [str(p) for p in compiled.outputs]
    assert imported.get_property("NUM_STREAMS") == 2
    assert imported.get_property("DEVICE_NAME") == device
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    results = await imported.create_infer_request().infer({"x": x})
    for got, want in zip(results.to_tuple(), reference_outputs(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    relaxed = core.import_model(blob, device, {"NUM_STREAMS": 1})
    assert relaxed.get_property("NUM_STREAMS") == 1


def test_blob_for_another_device_is_refused(core, device, mlp):
    _, compiled = mlp
    blob = compiled.export_model()
    other = next(d for d in DEVICES if d != device and d not in NO_EXPORT)
    with pytest.raises(ai.BlobDeviceError, match=f"'{device}', not '{other}'"):
        core.import_model(blob, other)
    with pytest.raises(ai.InvalidBlobError):
        core.import_model(blob[: len(blob) // 2], device)
    assert core.import_model(blob, device).get_property("NETWORK_NAME") == "mlp"
