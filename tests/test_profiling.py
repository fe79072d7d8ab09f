"""PERF_COUNT: per-node timings with op and execution types, next to the stage durations."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

import aioinfer as ai
from tests.helpers import make_model, mlp_model, tensor_info

pytestmark = pytest.mark.anyio


def _model() -> object:
    """Gemm + Relu (fused), then Det (the reference fallback), then Neg (native)."""
    nodes = [
        oh.make_node("Gemm", ["x", "w"], ["g"], name="gemm"),
        oh.make_node("Relu", ["g"], ["r"], name="relu"),
        oh.make_node("Det", ["r"], ["d"], name="det"),
        oh.make_node("Neg", ["d"], ["y"], name="neg"),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [3, 3])],
        [tensor_info("y", np.float32, [])],
        {"w": np.eye(3, dtype=np.float32)},
    )


X = np.diag([1.0, 2.0, 3.0]).astype(np.float32)


def test_off_by_default_only_stages() -> None:
    compiled = ai.Core().compile_model(_model(), "CPU")
    assert compiled.get_property("PERF_COUNT") is False
    request = compiled.create_infer_request()
    request.infer_sync({"x": X})
    info = request.get_profiling_info()
    assert [e["name"] for e in info] == ["preprocess", "start", "wait", "postprocess"]
    assert all(e["type"] == "stage" and e["seconds"] >= 0 for e in info)


def test_nodes_listed_with_op_and_execution_type() -> None:
    compiled = ai.Core().compile_model(_model(), "CPU", {"PERF_COUNT": "YES"})
    assert compiled.get_property("PERF_COUNT") is True
    request = compiled.create_infer_request()
    for _ in range(2):  # the first inference also records shapes for the memory plan
        results = request.infer_sync({"x": X})
        assert float(results["y"]) == pytest.approx(-6.0)
        info = request.get_profiling_info()
        stages = [e for e in info if e["type"] == "stage"]
        nodes = [e for e in info if e["type"] == "node"]
        assert [e["name"] for e in stages] == ["preprocess", "start", "wait", "postprocess"]
        assert [(e["name"], e["op_type"], e["execution_type"]) for e in nodes] == [
            ("gemm", "FusedGemm", "fused"),
            ("det", "Det", "fallback"),
            ("neg", "Neg", "native"),
        ]
        assert all(e["seconds"] >= 0 for e in nodes)
        assert sum(e["seconds"] for e in nodes) <= stages[1]["seconds"]


async def test_async_inference_is_profiled_too() -> None:
    compiled = ai.Core().compile_model(mlp_model(), "CPU", {"PERF_COUNT": True})
    async with compiled.create_infer_request() as request:
        await request.infer({"x": np.ones((2, 4), np.float32)})
        ops = [e["op_type"] for e in request.get_profiling_info() if e["type"] == "node"]
    assert ops == ["FusedMatMul", "ReduceSum"] or ops == ["FusedGemm", "ReduceSum"]


def test_bad_value_is_rejected() -> None:
    with pytest.raises(ai.InvalidPropertyValueError, match="PERF_COUNT"):
        ai.Core().compile_model(_model(), "CPU", {"PERF_COUNT": "sometimes"})
