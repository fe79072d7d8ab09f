"""NonMaxSuppression against onnx.reference (indices compared exactly)."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

from tests.kernels._check import check_node, run_aioinfer


def random_boxes(rng: np.random.Generator, batches: int, count: int) -> np.ndarray:
    corners = rng.uniform(0, 10, (batches, count, 2))
    sizes = rng.uniform(0.5, 4, (batches, count, 2))
    return np.concatenate([corners, corners + sizes], axis=-1).astype(np.float32)


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
@pytest.mark.parametrize(("limit", "iou"), [(3, 0.5), (100, 0.1), (100, 0.0)])
def test_non_max_suppression(
    center_point_box: int, score_threshold: float | None, limit: int, iou: float
) -> None:
    rng = np.random.default_rng(0)
    boxes = random_boxes(rng, 2, 40)
    scores = rng.uniform(0, 1, (2, 3, 40)).astype(np.float32)
    scores[0, 0, :5] = 0.5  # ties: the lower index first
    inputs = [boxes, scores, np.int64([limit]), np.float32([iou])]
    names = ["boxes", "scores", "limit", "iou"]
    if score_threshold is not None:
        inputs.append(np.float32([score_threshold]))
        names.append("threshold")
    node = oh.make_node("NonMaxSuppression", names, ["selected"], center_point_box=center_point_box)
    (got,) = check_node(node, inputs, opset=11)
    assert got.shape[1] == 3


def test_flipped_corners_and_empty_boxes() -> None:
    boxes = np.float32([[[2, 2, 0, 0], [0, 0, 2, 2], [1, 1, 1, 1], [0, 0, 1.9, 2]]])
    scores = np.float32([[[0.9, 0.8, 0.7, 0.6]]])
    node = oh.make_node("NonMaxSuppression", ["b", "s", "n", "i"], ["y"])
    (got,) = check_node(node, [boxes, scores, np.int64([10]), np.float32([0.5])], opset=11)
    # box 1 equals box 0 (corners flipped); the zero-area box 2 never overlaps
    assert got[:, 2].tolist() == [0, 2]


def test_no_limit_selects_nothing() -> None:
    node = oh.make_node("NonMaxSuppression", ["b", "s"], ["y"])
    (got,) = run_aioinfer(
        node, [np.zeros((1, 2, 4), np.float32), np.ones((1, 1, 2), np.float32)], 11
    )
    assert got.shape == (0, 3) and got.dtype == np.int64
