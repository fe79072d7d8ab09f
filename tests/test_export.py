"""export_model / import_model and the model cache (CACHE_DIR)."""

from __future__ import annotations

import dataclasses
import io
import struct
from pathlib import Path
from typing import Any

import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.plugin import blob as framing
from benchmarks import models
from tests.helpers import make_model, tensor_info

pytestmark = pytest.mark.anyio

RNG = np.random.default_rng(10)


def _cnn() -> object:
    """Conv + BatchNormalization + Relu, then Gemm: fused and folded when compiled."""
    return models.cnn(size=16, channels=(4, 8))


X = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)


def _run(compiled: ai.CompiledModel, x: np.ndarray = X) -> np.ndarray:
    return compiled.create_infer_request().infer_sync({"x": x})[0]


def test_export_import_round_trip_without_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    core = ai.Core()
    compiled = core.compile_model(_cnn(), "CPU")
    blob = compiled.export_model()
    assert blob.startswith(b"AIOINFER")

    def no_passes(*args: object, **kwargs: object) -> None:
        raise AssertionError("import must not run the passes")

    monkeypatch.setattr("aioinfer.devices.cpu.plugin.compile_passes", no_passes)
    imported = core.import_model(blob, "CPU")
    assert [n.op_type for n in imported.graph] == [n.op_type for n in compiled.graph]
    assert imported.inputs == compiled.inputs and imported.outputs == compiled.outputs
    np.testing.assert_array_equal(_run(imported), _run(compiled))


def test_export_to_a_stream_and_import_from_one() -> None:
    core = ai.Core()
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "ALLOW_AUTO_BATCHING": False}
    compiled = core.compile_model(_cnn(), "CPU", config)
    stream = io.BytesIO()
    blob = compiled.export_model(stream)
    assert stream.getvalue() == blob
    stream.seek(0)
    imported = core.import_model(stream, "CPU", {"PERF_COUNT": True})
    assert imported.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert imported.get_property("PERF_COUNT") is True
    np.testing.assert_array_equal(_run(imported), _run(compiled))


def _stateful() -> object:
    nodes = [
        oh.make_node("Add", ["past_0", "x"], ["present_0"]),
        oh.make_node("Neg", ["present_0"], ["y"]),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [2]), tensor_info("past_0", np.float32, [2])],
        [tensor_info("y", np.float32, [2]), tensor_info("present_0", np.float32, [2])],
    )


def test_stateful_pairs_survive_the_round_trip() -> None:
    core = ai.Core()
    compiled = core.compile_model(_stateful(), "CPU", {"STATEFUL": "auto"})
    imported = core.import_model(compiled.export_model(), "CPU")
    assert imported.get_property("STATEFUL") == {"past_0": "present_0"}
    assert [p.name for p in imported.inputs] == ["x"]
    request = imported.create_infer_request()
    assert [s.name for s in request.query_state()] == ["past_0"]
    request.infer_sync({"x": np.ones(2, np.float32)})
    y = request.infer_sync({"x": np.ones(2, np.float32)})["y"]
    np.testing.assert_array_equal(y, [-2.0, -2.0])
    with pytest.raises(ai.InvalidPropertyValueError, match="STATEFUL"):
        core.import_model(compiled.export_model(), "CPU", {"STATEFUL": {}})


def _blob() -> bytes:
    return ai.Core().compile_model(_stateful(), "CPU").export_model()


def _with_header(blob: bytes, **changes: Any) -> bytes:
    return framing.dump(dataclasses.replace(framing.load(blob, "CPU"), **changes))


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (
            lambda b: b"definitely not a model blob",
            ai.InvalidBlobError,
            "not an aioinfer export blob",
        ),
        (
            lambda b: bytes(RNG.integers(0, 256, 300, dtype=np.uint8)),
            ai.InvalidBlobError,
            "AIOINFER",
        ),
        (lambda b: b[: len(b) // 2], ai.InvalidBlobError, "truncated"),
        (lambda b: b[:-40] + bytes([b[-40] ^ 1]) + b[-39:], ai.InvalidBlobError, "checksum"),
        (
            lambda b: b[:8] + struct.pack("<H", 99) + b[10:],
            ai.BlobVersionError,
            "format version 99",
        ),
        (
            lambda b: _with_header(b, aioinfer_version="0.0.1"),
            ai.BlobVersionError,
            "aioinfer 0.0.1",
        ),
        (lambda b: _with_header(b, device="GPU"), ai.BlobDeviceError, "'GPU'"),
    ],
)
def test_bad_blobs_raise_specific_errors(make: object, error: type, words: str) -> None:
    core = ai.Core()
    blob = _blob()
    with pytest.raises(error, match=words):
        core.import_model(make(blob), "CPU")  # type: ignore[operator]
    assert isinstance(error(), ai.ImportModelError)
    request = core.import_model(blob, "CPU").create_infer_request()  # still usable
    assert request.infer_sync({"x": np.ones(2, np.float32), "past_0": np.ones(2, np.float32)})


def test_devices_without_export_say_so() -> None:
    core = ai.Core()
    batched = core.compile_model(_cnn(), "BATCH:CPU")
    with pytest.raises(ai.ExportError, match="BATCH"):
        batched.export_model()
    with pytest.raises(ai.ImportModelError, match="BATCH"):
        core.import_model(_blob(), "BATCH")


def test_cache_dir_compiles_once(tmp_path: Path) -> None:
    core = ai.Core()
    config = {"CACHE_DIR": str(tmp_path / "cache")}
    first = core.compile_model(_cnn(), "CPU", config)
    assert first.get_property("LOADED_FROM_CACHE") is False
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1
    second = core.compile_model(_cnn(), "CPU", config)
    assert second.get_property("LOADED_FROM_CACHE") is True
    np.testing.assert_array_equal(_run(second), _run(first))
    other = core.compile_model(_cnn(), "CPU", {**config, "NUM_STREAMS": 2})
    assert other.get_property("LOADED_FROM_CACHE") is False
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_damaged_cache_entry_is_compiled_again(tmp_path: Path) -> None:
    core = ai.Core()
    config = {"CACHE_DIR": str(tmp_path)}
    core.compile_model(_cnn(), "CPU", config)
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])
    again = core.compile_model(_cnn(), "CPU", config)
    assert again.get_property("LOADED_FROM_CACHE") is False
    assert core.compile_model(_cnn(), "CPU", config).get_property("LOADED_FROM_CACHE") is True


def test_a_stateful_model_is_loaded_from_the_cache(tmp_path: Path) -> None:
    """The cache entry keeps the pairs that ``STATEFUL: auto`` made (the hit used to
    index the string 'AUTO' as the pairs and fail with a TypeError)."""
    core = ai.Core()
    config = {"STATEFUL": "auto", "CACHE_DIR": str(tmp_path)}
    assert core.compile_model(_stateful(), "CPU", config).get_property("LOADED_FROM_CACHE") is False
    cached = core.compile_model(_stateful(), "CPU", config)
    assert cached.get_property("LOADED_FROM_CACHE") is True
    assert cached.get_property("STATEFUL") == {"past_0": "present_0"}
    request = cached.create_infer_request()
    request.infer_sync({"x": np.ones(2, np.float32)})
    y = request.infer_sync({"x": np.ones(2, np.float32)})["y"]
    np.testing.assert_array_equal(y, [-2.0, -2.0])


def test_cache_dir_must_be_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ai.InvalidPropertyValueError, match="CACHE_DIR"):
        ai.Core().compile_model(_cnn(), "CPU", {"CACHE_DIR": str(path)})


async def test_import_model_async() -> None:
    core = ai.Core()
    compiled = core.compile_model(_cnn(), "CPU")
    imported = await core.import_model_async(compiled.export_model(), "CPU")
    async with imported.create_infer_request() as request:
        result = await request.infer({"x": X})
    np.testing.assert_array_equal(result[0], _run(compiled))


@pytest.mark.parametrize("device", ["CPU", "ORT", "AUTO"])
def test_import_without_a_device_uses_the_one_the_blob_names(device: str) -> None:
    core = ai.Core()
    compiled = core.compile_model(_cnn(), device, {"PERFORMANCE_HINT": "LATENCY"})
    imported = core.import_model(compiled.export_model())
    assert imported.get_property("DEVICE_NAME") == device
    np.testing.assert_allclose(_run(imported), _run(compiled), rtol=1e-5, atol=1e-6)
    with pytest.raises(ai.InvalidBlobError):
        core.import_model(b"not a blob")
