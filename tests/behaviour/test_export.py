"""Export and import on each device: the imported model computes the same, keeps its
config unless told otherwise, and a blob for another device is refused by name."""

from __future__ import annotations

import io

import numpy as np
import pytest

import aioinfer as ai
from tests.behaviour.conftest import EXPORTING
from tests.helpers import reference_outputs

pytestmark = pytest.mark.anyio


def skip_unless_exporting(device: str, compiled: ai.CompiledModel) -> None:
    """Out of scope on a device that does not export yet: it raises the documented error."""
    if device not in EXPORTING:
        with pytest.raises(ai.ExportError, match=f"'{device}'"):
            compiled.export_model()
        pytest.skip(f"{device} does not export compiled models yet")


async def test_export_then_import_computes_the_same(core, device, mlp):
    model, mlp_compiled = mlp
    skip_unless_exporting(device, mlp_compiled)
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
    skip_unless_exporting(device, compiled)
    blob = compiled.export_model()
    other = next(d for d in EXPORTING if d != device)
    with pytest.raises(ai.BlobDeviceError, match=f"'{device}', not '{other}'"):
        core.import_model(blob, other)
    with pytest.raises(ai.InvalidBlobError):
        core.import_model(blob[: len(blob) // 2], device)
    assert core.import_model(blob, device).get_property("NETWORK_NAME") == "mlp"


def test_the_core_caches_the_device_s_models(core, device, mlp, tmp_path):
    """CACHE_DIR is the Core's: any device that exports gets the model cache."""
    model, _ = mlp
    config = {"CACHE_DIR": str(tmp_path), "NUM_STREAMS": 2}
    if device not in EXPORTING:  # a device declares CACHE_DIR only when its models export
        with pytest.raises(ai.UnknownPropertyError, match="'CACHE_DIR'"):
            core.compile_model(model, device, config)
        pytest.skip(f"{device} does not export compiled models yet: no model cache")
    first = core.compile_model(model, device, config)
    assert first.get_property("LOADED_FROM_CACHE") is False
    (entry,) = tmp_path.iterdir()
    cached = core.compile_model(model, device, config)
    assert cached.get_property("LOADED_FROM_CACHE") is True
    assert cached.get_property("NUM_STREAMS") == 2
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    got = cached.create_infer_request().infer_sync({"x": x})
    want = first.create_infer_request().infer_sync({"x": x})
    for a, b in zip(got.to_tuple(), want.to_tuple(), strict=True):
        np.testing.assert_array_equal(a, b)
    entry.write_bytes(entry.read_bytes()[:100])  # a damaged entry is compiled again
    assert core.compile_model(model, device, config).get_property("LOADED_FROM_CACHE") is False
    assert core.compile_model(model, device, config).get_property("LOADED_FROM_CACHE") is True
