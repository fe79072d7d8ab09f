"""FuseMatMulAddPass: MatMul + Add of a bias becomes Gemm (2-D) or FusedMatMul."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

from aioinfer.devices.cpu.passes.matmul_add import FuseMatMulAddPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(2)
WEIGHTS = {
    "w": RNG.standard_normal((6, 4)).astype(np.float32),
    "b": RNG.standard_normal(4).astype(np.float32),
}


def _model(x_shape: list[int]) -> object:
    nodes = [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Add", ["b", "m"], ["y"])]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, x_shape)],
        [tensor_info("y", np.float32, [*x_shape[:-1], 4])],
        WEIGHTS,
    )


def test_2d_matmul_add_becomes_gemm() -> None:
    model = _model([3, 6])
    assert op_types(model) == ["MatMul", "Add"]
    after = applied(model, FuseMatMulAddPass())
    assert op_types(after) == ["Gemm"]
    feeds = {"x": RNG.standard_normal((3, 6)).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


def test_3d_matmul_add_becomes_fused_matmul_with_bias() -> None:
    model = _model([2, 3, 6])
    after = applied(model, FuseMatMulAddPass())
    assert op_types(after) == ["FusedMatMul"]
    assert len(next(iter(after.graph)).inputs) == 3
    feeds = {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


def test_integer_matmul_is_left_alone() -> None:
    nodes = [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Add", ["m", "b"], ["y"])]
    model = make_model(
        nodes,
        [tensor_info("x", np.int32, [2, 2])],
        [tensor_info("y", np.int32, [2, 2])],
        {"w": np.eye(2, dtype=np.int32), "b": np.ones(2, np.int32)},
    )
    assert op_types(applied(model, FuseMatMulAddPass())) == ["MatMul", "Add"]
