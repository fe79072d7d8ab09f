"""FoldBatchNormPass: BatchNormalization folded into the Conv or Gemm before it."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

from aioinfer.transforms.fold_batchnorm import FoldBatchNormPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(0)


def _bn_params(channels: int) -> dict[str, np.ndarray]:
    return {
        "scale": RNG.uniform(0.5, 1.5, channels).astype(np.float32),
        "shift": RNG.normal(0, 0.5, channels).astype(np.float32),
        "mean": RNG.normal(0, 0.5, channels).astype(np.float32),
        "var": RNG.uniform(0.5, 2.0, channels).astype(np.float32),
    }


def _conv_bn(with_bias: bool) -> object:
    weights = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), **_bn_params(4)}
    conv_inputs = ["x", "w"]
    if with_bias:
        weights["b"] = RNG.standard_normal(4).astype(np.float32)
        conv_inputs.append("b")
    nodes = [
        oh.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
        oh.make_node(
            "BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"], epsilon=1e-3
        ),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 3, 8, 8])],
        [tensor_info("y", np.float32, [2, 4, 8, 8])],
        weights,
    )


def test_conv_batchnorm_becomes_one_conv() -> None:
    for with_bias in (False, True):
        model = _conv_bn(with_bias)
        assert op_types(model) == ["Conv", "BatchNormalization"]
        after = applied(model, FoldBatchNormPass())
        assert op_types(after) == ["Conv"]
        x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
        want = run_reference(model, {"x": x})
        assert_close(run_ir(after, {"x": x}), want)
        assert_close(run_compiled(model, {"x": x}), want)


def test_gemm_batchnorm_becomes_one_gemm() -> None:
    for trans_b in (0, 1):
        w = RNG.standard_normal((5, 6) if trans_b else (6, 5)).astype(np.float32)
        weights = {"w": w, "c": RNG.standard_normal(5).astype(np.float32), **_bn_params(5)}
        nodes = [
            oh.make_node("Gemm", ["x", "w", "c"], ["g"], transB=trans_b, beta=0.5, alpha=2.0),
            oh.make_node("BatchNormalization", ["g", "scale", "shift", "mean", "var"], ["y"]),
        ]
        model = make_model(
            nodes,
            [tensor_info("x", np.float32, [3, 6])],
            [tensor_info("y", np.float32, [3, 5])],
            weights,
        )
        after = applied(model, FoldBatchNormPass())
        assert op_types(after) == ["Gemm"]
        x = RNG.standard_normal((3, 6)).astype(np.float32)
        assert_close(run_ir(after, {"x": x}), run_reference(model, {"x": x}))


def test_batchnorm_with_a_second_reader_of_the_conv_stays() -> None:
    weights = {"w": RNG.standard_normal((4, 3, 1, 1)).astype(np.float32), **_bn_params(4)}
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"]),
        oh.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [1, 3, 4, 4])],
        [tensor_info("y", np.float32, [1, 4, 4, 4]), tensor_info("c", np.float32, [1, 4, 4, 4])],
        weights,
    )
    assert op_types(applied(model, FoldBatchNormPass())) == ["Conv", "BatchNormalization"]
