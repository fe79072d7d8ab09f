"""FoldOneHotMatMulPass: a one-hot encoding times a constant matrix (jax2tf's
``one_hot(x, K) @ W``, Magika's byte embedding) becomes a row lookup.

Checked against onnx.reference running the unfused nodes: each row of the product is one
row of ``W`` (plus the bias) exactly, so the values agree bit for bit."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from aioinfer.devices.cpu.passes.fold_one_hot import FoldOneHotMatMulPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import applied, op_types, run_compiled, run_ir, run_reference

CLASSES = 7
rng = np.random.default_rng(31)


def _model(
    bias: bool, classes: np.ndarray | None = None, weight: np.ndarray | None = None
) -> object:
    """``Cast(Equal(x, classes)) @ W (+ b)`` for ``x`` of shape [2, 5, 1]."""
    nodes = [
        oh.make_node("Equal", ["x", "classes"], ["hot"]),
        oh.make_node("Cast", ["hot"], ["f"], to=1),
        oh.make_node("MatMul", ["f", "w"], ["y" if not bias else "p"]),
    ]
    constants = {
        "classes": np.arange(CLASSES, dtype=np.int32).reshape(1, 1, CLASSES)
        if classes is None
        else classes,
        "w": rng.standard_normal((CLASSES, 4)).astype(np.float32) if weight is None else weight,
    }
    if bias:
        nodes.append(oh.make_node("Add", ["p", "b"], ["y"]))
        constants["b"] = rng.standard_normal((1, 1, 4)).astype(np.float32)
    return make_model(
        nodes,
        [tensor_info("x", np.int32, [2, 5, 1])],
        [tensor_info("y", np.float32, [2, 5, 4])],
        constants,
    )


# Indices in range, and out of it on both sides (a zero row, or the bias alone).
X = np.array([0, 6, 3, 3, -1, 7, 100, 2, 5, 1], np.int32).reshape(2, 5, 1)


@pytest.mark.parametrize("bias", [False, True])
def test_one_hot_matmul_becomes_a_lookup(bias: bool) -> None:
    model = _model(bias)
    after = applied(model, FoldOneHotMatMulPass())
    assert op_types(after) == ["OneHotMatMul"]
    want = run_reference(model, {"x": X})[0]
    np.testing.assert_array_equal(run_ir(after, {"x": X})[0], want)
    np.testing.assert_array_equal(run_compiled(model, {"x": X})[0], want)
    inside = X % CLASSES  # no index out of range: the lookup without the clamp
    np.testing.assert_array_equal(
        run_compiled(model, {"x": inside})[0], run_reference(model, {"x": inside})[0]
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")
def test_other_classes_or_weights_stay_a_product() -> None:
    """Classes that are not 0..K-1, and a W with an infinity (0 * inf is NaN in the
    product, not 0): left as they are, and still computed right."""
    shuffled = np.array([0, 2, 1, 3, 4, 5, 6], np.int32).reshape(1, 1, CLASSES)
    weight = rng.standard_normal((CLASSES, 4)).astype(np.float32)
    weight[2, 1] = np.inf
    for model in (_model(True, classes=shuffled), _model(False, weight=weight)):
        assert "OneHotMatMul" not in op_types(applied(model, FoldOneHotMatMulPass()))
        np.testing.assert_allclose(
            run_compiled(model, {"x": X})[0], run_reference(model, {"x": X})[0], rtol=1e-6
        )


def test_a_bias_that_varies_along_rows_is_not_folded() -> None:
    """A bias with a value per position (not one row for all) stays an Add."""
    model = _model(True)
    per_row = rng.standard_normal((2, 5, 4)).astype(np.float32)
    model.graph.initializer[2].CopyFrom(onh.from_array(per_row, "b"))
    after = applied(model, FoldOneHotMatMulPass())
    assert op_types(after) == ["OneHotMatMul", "Add"]
    np.testing.assert_array_equal(
        run_compiled(model, {"x": X})[0], run_reference(model, {"x": X})[0]
    )
