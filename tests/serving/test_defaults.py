"""The server's defaults for a model whose config names no device: AUTO, the THROUGHPUT
hint and dynamic batching for a batchable model; each config key overrides its part."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from aioinfer.serving import create_app
from aioinfer.serving.models import ServedModel
from aioinfer.serving.repository import engine_threads
from tests.helpers import accumulator_model, mlp_model, reference_outputs, two_input_model
from tests.serving.conftest import LiveServer, write_config, write_model

DEVICE = "BATCH:AUTO"
"""A batchable model batches on the server's threads when AUTO picks an engine (ORT): up
to 64 rows, on one stream."""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """mlp: no config.json; plain: not batchable; counter: stateful, no device;
    latency: hint and batching given; cpu: the device given."""
    write_model(tmp_path, "mlp", 1, mlp_model())
    write_model(tmp_path, "plain", 1, two_input_model())
    write_model(tmp_path, "counter", 1, accumulator_model())
    write_config(tmp_path, "counter", {"stateful": {"past": "present"}})
    write_model(tmp_path, "latency", 1, mlp_model())
    write_config(tmp_path, "latency", {"hint": "LATENCY", "batching": False})
    write_model(tmp_path, "cpu", 1, mlp_model())
    write_config(tmp_path, "cpu", {"device": "CPU"})
    return tmp_path


def served(app: object, name: str) -> ServedModel:
    return app.state.server.models[name]["1"]  # type: ignore[attr-defined, no-any-return]


def test_defaults_are_applied_and_logged(
    repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(repository)
    with caplog.at_level(logging.INFO, logger="aioinfer"), LiveServer(app) as live:
        mlp = served(app, "mlp").compiled
        assert mlp.get_property("DEVICE_NAME") == DEVICE
        assert mlp.get_property("EXECUTION_DEVICES") == ("ORT",)
        assert mlp.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
        assert mlp.max_batch_size() == 64
        assert mlp.streams == 1

        plain = served(app, "plain").compiled
        assert plain.get_property("DEVICE_NAME") == "AUTO"
        assert plain.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
        assert plain.max_batch_size() is None

        counter = served(app, "counter").compiled
        assert (counter.get_property("DEVICE_NAME"), counter.max_batch_size()) == ("AUTO", None)

        latency = served(app, "latency").compiled
        assert latency.get_property("DEVICE_NAME") == "AUTO"
        assert latency.get_property("PERFORMANCE_HINT") == "LATENCY"
        assert latency.max_batch_size() is None

        cpu = served(app, "cpu").compiled
        assert cpu.get_property("DEVICE_NAME") == "CPU"
        assert cpu.get_property("PERFORMANCE_HINT") == "LATENCY"  # the device's default

        client = httpclient.InferenceServerClient(live.url)
        x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
        row = httpclient.InferInput("x", [1, 4], "FP32")
        row.set_data_from_numpy(x, binary_data=True)
        result = client.infer("mlp", [row])
        expected = reference_outputs(mlp_model(), {"x": x})
        np.testing.assert_allclose(result.as_numpy("y"), expected[0], rtol=1e-5, atol=1e-6)
        client.close()

    lines = {r.getMessage().split(":")[0]: r.getMessage() for r in caplog.records}
    assert lines["model 'mlp' version 1"] == (
        f"model 'mlp' version 1: {DEVICE} on ORT, hint THROUGHPUT, 1 stream(s), "
        "batches of up to 64 rows, 128 inferences at once (server defaults: device AUTO, "
        "hint THROUGHPUT, dynamic batching (BATCH), batches of up to 64 rows, one stream, "
        f"{engine_threads()} compute thread(s): a core for the loop)"
    )
    assert lines["model 'plain' version 1"].endswith(
        "(server defaults: device AUTO, hint THROUGHPUT, no batching: input 'scale' (scale: "
        "int64[3]) has first dimension 3, not a symbolic batch dimension)"
    )
    assert "no batching: it keeps state" in lines["model 'counter' version 1"]
    assert lines["model 'latency' version 1"].endswith("(server defaults: device AUTO)")
    assert "server defaults" not in lines["model 'cpu' version 1"]
