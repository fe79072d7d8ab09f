"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

from tests.kernels._check import check_node


@pytest.mark.parametrize("op_type", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2)])
def test_losses(
    op_type: str, reduction: str, weighted: bool, ignore_index: int | None, shape: tuple
) -> None:
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(shape).astype(np.float32)
    target = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    target.flat[0] = 1  # one ignored entry at least when ignore_index is 1
    inputs = [scores, target]
    names = ["x", "t"]
    if weighted:
        inputs.append(np.float32([0.2, 1.5, 0.7]))
        names.append("w")
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    outputs = ["loss", "log_prob"] if op_type == "SoftmaxCrossEntropyLoss" else ["loss"]
    node = oh.make_node(op_type, names, outputs, **attrs)
    check_node(node, inputs, opset=13, rtol=1e-5, atol=1e-6)
