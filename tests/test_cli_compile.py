"""``aioinfer compile``: a model compiled ahead of time into a blob, which ``aioinfer run``,
``aioinfer serve`` and ``Core.import_model`` load without compiling again."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

import aioinfer as ai
from aioinfer.cli import main
from aioinfer.models import default_model_path
from aioinfer.plugin.blob import load
from tests.helpers import mlp_model, reference_outputs
from tests.serving.test_cli_serve import start, wait_for

IMAGES = np.random.default_rng(7).standard_normal((4, 3, 32, 32)).astype(np.float32)


def _outputs(out: str) -> tuple[list[float], list[int]]:
    """The printed summary (min, max, mean) and top-1 indices of ``probabilities``."""
    summary = re.search(r"probabilities: .* min (\S+) max (\S+) mean (\S+)", out)
    top1 = re.search(r"top-1 per row: \[([\d, ]+)\]", out)
    assert summary is not None and top1 is not None, out
    return [float(v) for v in summary.groups()], [int(v) for v in top1.group(1).split(",")]


@pytest.mark.parametrize("device", ["ORT", "CPU"])
def test_compile_writes_a_blob_that_run_and_import_load(tmp_path, capsys, device):
    blob = tmp_path / "cnn.blob"
    argv = ["compile", str(default_model_path()), "-d", device, "-o", str(blob)]
    argv += ["-c", "PERFORMANCE_HINT=THROUGHPUT", "-c", "NUM_STREAMS=2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"device:       {device}" in out and f"blob:         {blob}" in out
    exported = load(blob.read_bytes(), device)
    assert (exported.config["PERFORMANCE_HINT"], exported.config["NUM_STREAMS"]) == (
        "THROUGHPUT",
        2,
    )
    imported = ai.Core().import_model(blob.read_bytes(), device)
    assert imported.get_property("NUM_STREAMS") == 2
    got = imported.create_infer_request().infer_sync({"image": IMAGES})
    want = reference_outputs(onnx.load(default_model_path()), {"image": IMAGES})
    np.testing.assert_allclose(got["probabilities"], want[0], rtol=1e-4, atol=1e-6)

    # ``run`` takes the blob in place of a model, on the device the blob names.
    np.save(tmp_path / "images.npy", IMAGES)
    given = ["--input", f"image={tmp_path / 'images.npy'}"]
    assert main(["run", str(blob), *given]) == 0
    from_blob = capsys.readouterr().out
    assert f"device:       {device}" in from_blob
    assert main(["run", str(default_model_path()), "--device", device, *given]) == 0
    from_model = capsys.readouterr().out
    (summary, top1), (want_summary, want_top1) = _outputs(from_blob), _outputs(from_model)
    assert top1 == want_top1
    np.testing.assert_allclose(summary, want_summary, rtol=1e-4, atol=1e-6)


def test_the_output_defaults_to_the_model_name_and_values_are_json(tmp_path, capsys):
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), model)
    pairs = json.dumps({"nope": "y"})  # a JSON object; no such input: refused by name
    assert main(["compile", str(model), "-d", "CPU", "-c", f"STATEFUL={pairs}"]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert not (tmp_path / "mlp.blob").exists()
    assert (
        main(["compile", str(model), "-d", "ORT", "-c", "ORT_PROVIDERS=CPUExecutionProvider"]) == 0
    )
    exported = load((tmp_path / "mlp.blob").read_bytes(), "ORT")
    assert exported.config["ORT_PROVIDERS"] == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-d", "ORT", "-c", "NUM_STREAMS"], "-c expects KEY=VALUE, got 'NUM_STREAMS'"),
        (["-d", "ORT", "-c", "NO_SUCH=1"], "unknown property 'NO_SUCH'"),
        (["-d", "NOPE"], "unknown device 'NOPE'"),
        (["-d", "BATCH:CPU"], "does not export"),
    ],
)
def test_compile_errors_say_what_is_wrong_and_write_nothing(tmp_path, capsys, argv, words):
    blob = tmp_path / "out.blob"
    assert main(["compile", str(default_model_path()), "-o", str(blob), *argv]) == 2
    assert words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_a_blob_for_another_device(tmp_path, capsys):
    blob = tmp_path / "cnn.blob"
    assert main(["compile", str(default_model_path()), "-d", "ORT", "-o", str(blob)]) == 0
    capsys.readouterr()
    assert main(["run", str(blob), "--device", "CPU"]) == 2
    assert "exported for device 'ORT', not 'CPU'" in capsys.readouterr().err
    blob.write_bytes(blob.read_bytes()[:-10])
    assert main(["run", str(blob)]) == 2
    assert "truncated or padded blob" in capsys.readouterr().err


def test_serve_loads_a_blob_from_the_repository(tmp_path: Path, capsys):
    repo = tmp_path / "repo"
    (repo / "cnn" / "1").mkdir(parents=True)
    blob = repo / "cnn" / "1" / "model.blob"
    assert main(["compile", str(default_model_path()), "-d", "ORT", "-o", str(blob)]) == 0
    capsys.readouterr()
    config = {"hint": "THROUGHPUT", "properties": {"NUM_STREAMS": 2}}
    (repo / "cnn" / "config.json").write_text(json.dumps(config))
    process, lines = start(str(repo), "--port", "0")
    try:
        port = wait_for(lines, r"running on http://127\.0\.0\.1:(\d+)").group(1)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        tensor = httpclient.InferInput("image", list(IMAGES.shape), "FP32")
        tensor.set_data_from_numpy(IMAGES)
        result = client.infer("cnn", [tensor]).as_numpy("probabilities")
        want = reference_outputs(onnx.load(default_model_path()), {"image": IMAGES})[0]
        np.testing.assert_allclose(result, want, rtol=1e-4, atol=1e-6)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.wait()
