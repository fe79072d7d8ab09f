"""FoldTransposePass: a Transpose of the last two axes becomes a matmul flag."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

from aioinfer.devices.cpu.passes.fold_transpose import FoldTransposePass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(1)


def test_transposed_matmul_operands_become_flags() -> None:
    nodes = [
        oh.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
        oh.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["at", "bt"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("a", np.float32, [2, 5, 3]), tensor_info("b", np.float32, [2, 4, 5])],
        [tensor_info("y", np.float32, [2, 3, 4])],
    )
    after = applied(model, FoldTransposePass())
    assert op_types(after) == ["FusedMatMul"]
    fused = next(iter(after.graph))
    assert fused.attributes["transA"].as_int() == 1 and fused.attributes["transB"].as_int() == 1
    feeds = {
        "a": RNG.standard_normal((2, 5, 3)).astype(np.float32),
        "b": RNG.standard_normal((2, 4, 5)).astype(np.float32),
    }
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


def test_gemm_flips_its_own_flag_and_other_perms_stay() -> None:
    nodes = [
        oh.make_node("Transpose", ["a"], ["at"], perm=[1, 0]),
        oh.make_node("Gemm", ["at", "w"], ["g"], transA=1),
        oh.make_node("Transpose", ["g4"], ["gt"], perm=[2, 1, 0]),
        oh.make_node("MatMul", ["gt", "v"], ["y"]),
    ]
    model = make_model(
        nodes,
        [
            tensor_info("a", np.float32, [3, 4]),
            tensor_info("g4", np.float32, [2, 3, 4]),
            tensor_info("v", np.float32, [2, 5]),
        ],
        [tensor_info("g", np.float32, [3, 5]), tensor_info("y", np.float32, [4, 3, 5])],
        {"w": RNG.standard_normal((4, 5)).astype(np.float32)},
    )
    after = applied(model, FoldTransposePass())
    assert op_types(after) == ["Gemm", "Transpose", "MatMul"]
    assert next(iter(after.graph)).attributes["transA"].as_int() == 0
    feeds = {
        "a": RNG.standard_normal((3, 4)).astype(np.float32),
        "g4": RNG.standard_normal((2, 3, 4)).astype(np.float32),
        "v": RNG.standard_normal((2, 5)).astype(np.float32),
    }
    assert_close(run_ir(after, feeds), run_reference(model, feeds))
