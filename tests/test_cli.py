"""The ``aioinfer`` command line and the bundled default model."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import anyio
import numpy as np
import pytest

import aioinfer
from aioinfer.cli import main
from aioinfer.models import default_model_path

ROOT = Path(__file__).resolve().parent.parent


def _top1(out: str) -> list[int]:
    match = re.search(r"top-1 per row: \[([\d, ]+)\]", out)
    assert match is not None, out
    return [int(v) for v in match.group(1).split(",")]


def _summary(out: str, name: str) -> tuple[float, float, float]:
    match = re.search(rf"{name}: .* min (\S+) max (\S+) mean (\S+)", out)
    assert match is not None, out
    return float(match.group(1)), float(match.group(2)), float(match.group(3))


def _ort_run(images: np.ndarray) -> np.ndarray:
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(
        str(default_model_path()), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"image": images})[0]


# -- run ----------------------------------------------------------------------------------


def test_run_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "model:        tiny_cnn" in out
    assert "device:       AUTO (on ORT)" in out  # the default device, and its choice
    assert "image: float32 [1, 3, 32, 32] (random, seed 0)" in out
    assert "probabilities: float32 [1, 10] min " in out
    assert len(_top1(out)) == 1
    assert re.search(r"latency: +\d+\.\d+ ms", out)
    assert re.search(r"stages: +preprocess \S+ ms, start \S+ ms, wait \S+ ms, postprocess", out)


def test_run_shape_iterations_hint(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--shape", "image=2,3,32,32", "--iterations", "3", "--hint", "throughput"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "image: float32 [2, 3, 32, 32]" in out
    assert "probabilities: float32 [2, 10]" in out
    assert len(_top1(out)) == 2
    assert re.search(r"latency: +first \S+ ms, median \S+ ms over 3 iterations", out)


def test_run_input_file_matches_onnxruntime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Constant images: unlike noise (always class 0), these get different classes.
    images = np.zeros((3, 3, 32, 32))
    images[0] = 3.0
    images[1] = -3.0
    images[2, 0] = -2.0
    file = tmp_path / "images.npy"
    np.save(file, images)  # float64: the command converts it to the port's float32
    expected = _ort_run(images.astype(np.float32))
    assert len(set(expected.argmax(axis=1).tolist())) > 1

    assert main(["run", str(default_model_path()), "--input", f"image={file}"]) == 0
    out = capsys.readouterr().out
    assert f"image: float32 [3, 3, 32, 32] ({file})" in out
    assert _top1(out) == expected.argmax(axis=1).tolist()
    low, high, mean = _summary(out, "probabilities")
    np.testing.assert_allclose(
        [low, high, mean], [expected.min(), expected.max(), expected.mean()], rtol=1e-4
    )


def test_run_seed_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    summaries = []
    for seed in ("1", "1", "2"):
        assert main(["run", "--seed", seed]) == 0
        summaries.append(_summary(capsys.readouterr().out, "probabilities"))
    assert summaries[0] == summaries[1]
    assert summaries[0] != summaries[2]


# -- user errors: one line on stderr, exit code 2 -------------------------------------------


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def test_missing_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.onnx"
    message = _error(capsys, ["run", str(missing)])
    assert "not found" in message and str(missing) in message


def test_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert "not an ONNX model" in _error(capsys, ["run", str(junk)])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--shape", "image=1,3,a,32"], "--shape image: expected comma-separated integers"),
        (["--shape", "image=1,-3,32,32"], "--shape image: dimensions must be >= 0"),
        (["--shape", "image"], "--shape expects NAME=D0,D1,..., got 'image'"),
        (["--shape", "=1,3,32,32"], "--shape expects NAME=D0,D1,..."),
        (["--shape", "image=1,3", "--shape", "image=1,3"], "--shape given twice for 'image'"),
        (["--shape", "label=1"], "no input named 'label'"),
        (["--shape", "image=1,3,32"], "expected rank 4"),
        (["--input", "image"], "--input expects NAME=FILE.npy"),
        (["--input", "image=/nonexistent/x.npy"], "--input image: cannot read"),
        (["--iterations", "0"], "--iterations must be >= 1, got 0"),
        (["--device", "TPU"], "unknown device 'TPU'; available: CPU"),
    ],
)
def test_run_user_errors(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in _error(capsys, ["run", *argv])


def test_input_with_wrong_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "ints.npy"
    np.save(file, np.zeros((1, 3, 32, 32), np.int64))
    assert "expected element type float32, got int64" in _error(
        capsys, ["run", "--input", f"image={file}"]
    )


def test_argparse_errors_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--hint", "FASTEST"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main([]) == 2
    assert "usage: aioinfer" in capsys.readouterr().err


# -- info, version --------------------------------------------------------------------------


def test_info_lists_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "CPU"
    assert "  DEVICE_NAME: CPU" in out
    assert re.search(r"^  NUM_CORES: [1-9]\d*$", out, re.MULTILINE)
    assert "  PERFORMANCE_HINT: LATENCY" in out  # what compile_model uses unless told
    assert "  NETWORK_NAME (per compiled model)" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"aioinfer {aioinfer.__version__}\n"


# -- the bundled model ----------------------------------------------------------------------


def test_bundled_model_is_reproducible(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "scripts/make_models.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", str(tmp_path)]) == 0
    fresh = (tmp_path / "tiny_cnn.onnx").read_bytes()
    assert fresh == default_model_path().read_bytes()
    assert len(fresh) < 200_000


def test_default_model_matches_onnxruntime() -> None:
    images = np.random.default_rng(7).standard_normal((3, 3, 32, 32)).astype(np.float32)
    expected = _ort_run(images)

    async def infer() -> np.ndarray:
        compiled = await aioinfer.Core().compile_model_async(default_model_path(), "CPU")
        assert [(p.name, p.dtype, p.shape) for p in compiled.inputs] == [
            ("image", np.dtype(np.float32), ("batch", 3, 32, 32))
        ]
        assert [(p.name, p.shape) for p in compiled.outputs] == [("probabilities", ("batch", 10))]
        results = await compiled.create_infer_request().infer({"image": images})
        return results["probabilities"]

    actual = anyio.run(infer)
    assert actual.dtype == np.float32 and actual.shape == (3, 10)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
