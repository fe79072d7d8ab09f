"""Export, import and CACHE_DIR on the OPENVINO device: OpenVINO's own export inside the
shared blob framing.

Results of an imported model are compared with the model compiled from the ONNX model
(float32, rtol 1e-5, atol 1e-6). The model cache is shown to load by what it returns:
an entry replaced by the blob of another model with the same ports gives that model's
results.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.plugin.blob import dump, load
from tests.helpers import lstm_state_model, make_model, mlp_model, tensor_info

pytestmark = pytest.mark.anyio

X = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_the_device_declares_export_and_import() -> None:
    core = ai.Core()
    assert "EXPORT_IMPORT" in core.get_property("OPENVINO", "OPTIMIZATION_CAPABILITIES")
    compiled = core.compile_model(mlp_model(), "OPENVINO")
    for name in ("CACHE_DIR", "LOADED_FROM_CACHE", "STATEFUL"):
        assert name in compiled.get_property("SUPPORTED_PROPERTIES")


async def test_an_imported_model_computes_as_the_compiled_one() -> None:
    core = ai.Core()
    compiled = core.compile_model(mlp_model(), "OPENVINO", {"PERF_COUNT": True})
    blob = compiled.export_model()
    imported = core.import_model(blob, "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    assert imported.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert imported.get_property("INFERENCE_PRECISION_HINT") == "f32"
    assert imported.get_property("PERF_COUNT") is True
    expected = (await compiled.create_infer_request().infer({"x": X}))["y"]
    request = imported.create_infer_request()
    assert_close((await request.infer({"x": X}))["y"], expected)
    assert any(entry["type"] == "node" for entry in request.get_profiling_info())
    with pytest.raises(ai.BlobDeviceError):
        core.import_model(blob, "CPU")


def test_a_recurrent_model_imports_with_the_same_results() -> None:
    """OpenVINO's own export of an ONNX LSTM imports with other results (2026.4): such a
    model is exported as ONNX and compiled again on import."""
    core = ai.Core()
    compiled = core.compile_model(lstm_state_model(), "OPENVINO")
    imported = core.import_model(compiled.export_model(), "OPENVINO")
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.standard_normal((3, 2, 4)).astype(np.float32),
        "h0": rng.standard_normal((1, 2, 8)).astype(np.float32),
        "c0": rng.standard_normal((1, 2, 8)).astype(np.float32),
    }
    expected = compiled.create_infer_request().infer_sync(feeds)
    got = imported.create_infer_request().infer_sync(feeds)
    for name in ("Y", "hn", "cn"):
        assert_close(got[name], expected[name])


def _offset_model(offset: float) -> object:
    return make_model(
        [oh.make_node("Add", ["x", "w"], ["y"])],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
        {"w": np.full(2, offset, np.float32)},
    )


def test_the_second_compile_is_loaded_from_the_cache(tmp_path: Path) -> None:
    core = ai.Core()
    config = {"CACHE_DIR": str(tmp_path)}
    first = core.compile_model(_offset_model(1.0), "OPENVINO", config)
    assert first.get_property("LOADED_FROM_CACHE") is False
    (entry,) = tmp_path.iterdir()
    # The entry now holds another model with the same ports (x + 100): a compile from
    # the cache computes that one.
    other = core.compile_model(_offset_model(100.0), "OPENVINO").export_model()
    entry.write_bytes(other)
    cached = core.compile_model(_offset_model(1.0), "OPENVINO", config)
    assert cached.get_property("LOADED_FROM_CACHE") is True
    x = np.array([1, 2], np.float32)
    assert cached.create_infer_request().infer_sync({"x": x})["y"].tolist() == [101, 102]
    assert first.create_infer_request().infer_sync({"x": x})["y"].tolist() == [2, 3]


def test_a_stateful_model_is_cached_with_its_variables(tmp_path: Path) -> None:
    core = ai.Core()
    config = {"STATEFUL": "auto", "CACHE_DIR": str(tmp_path)}
    first = core.compile_model(lstm_state_model(), "OPENVINO", config)
    cached = core.compile_model(lstm_state_model(), "OPENVINO", config)
    assert cached.get_property("LOADED_FROM_CACHE") is True
    assert cached.get_property("STATEFUL") == {"h0": "hn", "c0": "cn"}
    feeds = {"X": np.random.default_rng(1).standard_normal((3, 2, 4)).astype(np.float32)}
    requests = [first.create_infer_request(), cached.create_infer_request()]
    for _ in range(2):
        expected, got = (r.infer_sync(feeds)["Y"] for r in requests)
        assert_close(got, expected)


def _with_payload(blob: bytes, payload: bytes) -> bytes:
    return dump(dataclasses.replace(load(blob, "OPENVINO"), payload=payload))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda p: p[:3], "truncated OPENVINO payload"),
        (lambda p: b"\xff\xff\x00\x00" + p[4:], "truncated OPENVINO payload"),
        (lambda p: p[:4] + b"{" * (p[0] + 256 * p[1]) + p[4 + p[0] + 256 * p[1] :], "JSON"),
        (lambda p: p[: 4 + p[0] + 256 * p[1]] + b"not an OpenVINO blob", "OpenVINO cannot import"),
        (lambda p: p[: 4 + p[0] + 256 * p[1]], "OpenVINO cannot import"),
    ],
    ids=["cut", "json-length", "json", "engine-blob", "no-engine-blob"],
)
def test_a_broken_payload_raises_invalid_blob(edit, words) -> None:
    core = ai.Core()
    blob = core.compile_model(mlp_model(), "OPENVINO").export_model()
    payload = bytes(load(blob, "OPENVINO").payload)
    with pytest.raises(ai.InvalidBlobError, match=words):
        core.import_model(_with_payload(blob, edit(payload)), "OPENVINO")
    with pytest.raises(ai.InvalidBlobError, match="checksum"):
        core.import_model(blob[:-40] + bytes(8) + blob[-32:], "OPENVINO")
