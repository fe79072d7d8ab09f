"""benchmarks/real_models.py: models located in installed wheels, measured against
onnxruntime with per-model agreement checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from benchmarks import real_models
from tests.helpers import mlp_model


def _case(package: str = "onnx", path: str = "mlp.onnx", **tolerances: float) -> real_models.Case:
    return real_models.Case(
        "mlp",
        package,
        path,
        "a small MLP",
        lambda rng: {"x": rng.standard_normal((2, 4)).astype(np.float32)},
        **tolerances,
    )


def test_models_are_found_in_installed_wheels_or_skipped() -> None:
    light = "onnx/backend/test/data/light/light_squeezenet.onnx"
    found = real_models.locate(_case(path=light))
    assert found is not None and found.name == "light_squeezenet.onnx"
    assert real_models.locate(_case(path="onnx/no/such/model.onnx")) is None
    assert real_models.locate(_case(package="aioinfer-no-such-package")) is None


def test_measure_and_table(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    row = real_models.measure(_case(), path, blocks=1, runs=2, warmup=1)
    assert row.sync_ms > 0 and row.async_ms > 0 and row.ort_ms > 0
    assert row.agrees and row.excess <= 1.0
    text = real_models.table([row])
    assert f"| {row.ratio:.2f} |" in text and "**geometric mean**" in text


def test_agreement_applies_the_tolerances_and_exact_integers() -> None:
    case = _case(rtol=0.0, atol=1e-3)
    assert real_models.agreement(case, [np.float32([1.0005])], [np.float32([1.0])])[0]
    agrees, excess = real_models.agreement(case, [np.float32([1.01])], [np.float32([1.0])])
    assert not agrees and excess == pytest.approx(10.0, rel=1e-3)
    assert not real_models.agreement(case, [np.int64([3])], [np.int64([4])])[0]
    assert not real_models.agreement(case, [np.zeros(2)], [np.zeros(3)])[0]


def test_every_case_builds_inputs_its_model_declares() -> None:
    """Each case's inputs are named as in its model (checked where the package is
    installed; the benchmark's requirements file lists them)."""
    for case in real_models.CASES.values():
        path = real_models.locate(case)
        if path is None:
            continue
        graph = onnx.load(path, load_external_data=False).graph
        initializers = {i.name for i in graph.initializer}
        declared = {i.name for i in graph.input if i.name not in initializers}
        assert set(case.feeds(np.random.default_rng(0))) == declared, case.name


def test_measure_on_another_device_and_the_worst_ratio(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    row = real_models.measure(_case(), path, blocks=1, runs=2, warmup=1, device="ORT")
    assert row.agrees and row.sync_ms > 0 and row.async_ms > 0
    text = real_models.table([row])
    assert f"| worst | | | | | | {row.ratio:.2f} (mlp) |" in text
