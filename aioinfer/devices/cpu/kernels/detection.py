"""Object detection kernels: NonMaxSuppression.

For each batch and class, boxes above ``score_threshold`` are taken in order of
decreasing score (ties: the lower box index first); each taken box removes the remaining
boxes whose intersection over union with it is strictly greater than ``iou_threshold``,
until ``max_output_boxes_per_class`` are taken. Boxes of zero area never suppress.
"""

from __future__ import annotations

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def _corners(boxes: np.ndarray, center_point_box: bool) -> np.ndarray:
    """(n, 4) boxes as (y_min, x_min, y_max, x_max) in float64."""
    boxes = boxes.astype(np.float64)
    if center_point_box:  # (x_center, y_center, width, height)
        half = boxes[:, 2:] / 2
        lower, upper = boxes[:, :2] - half, boxes[:, :2] + half
        return np.stack((lower[:, 1], lower[:, 0], upper[:, 1], upper[:, 0]), axis=1)
    # (y1, x1, y2, x2): any two opposite corners
    return np.concatenate(
        (np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:])), axis=1
    )


def _overlaps(box: np.ndarray, others: np.ndarray, threshold: float) -> np.ndarray:
    """Which of ``others`` have an intersection over union with ``box`` above threshold."""
    top_left = np.maximum(box[:2], others[:, :2])
    bottom_right = np.minimum(box[2:], others[:, 2:])
    sides = np.clip(bottom_right - top_left, 0, None)
    intersection = sides[:, 0] * sides[:, 1]
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - intersection
    valid = (intersection > 0) & (area > 0) & (areas > 0) & (union > 0)
    iou = np.divide(intersection, union, out=np.zeros_like(union), where=valid)
    return valid & (iou > threshold)


def _select(corners: np.ndarray, scores: np.ndarray, limit: int, iou: float) -> list[int]:
    order = np.argsort(-scores, kind="stable")
    taken: list[int] = []
    while order.size and len(taken) < limit:
        best, order = order[0], order[1:]
        taken.append(int(best))
        order = order[~_overlaps(corners[best], corners[order], iou)]
    return taken


@kernel("NonMaxSuppression", since=10)
def _non_max_suppression(spec: NodeSpec) -> Kernel:
    center_point_box = bool(spec.attr("center_point_box", 0))

    def run(
        boxes: np.ndarray,
        scores: np.ndarray,
        max_output_boxes_per_class: np.ndarray | None = None,
        iou_threshold: np.ndarray | None = None,
        score_threshold: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        limit = 0
        if max_output_boxes_per_class is not None and max_output_boxes_per_class.size:
            limit = max(int(max_output_boxes_per_class.reshape(-1)[0]), 0)
        iou = 0.0
        if iou_threshold is not None and iou_threshold.size:
            iou = float(iou_threshold.reshape(-1)[0])
        selected: list[tuple[int, int, int]] = []
        for batch in range(boxes.shape[0]):
            corners = _corners(boxes[batch], center_point_box)
            for cls in range(scores.shape[1]):
                class_scores = scores[batch, cls].astype(np.float64)
                candidates = np.arange(class_scores.size)
                if score_threshold is not None and score_threshold.size:
                    candidates = np.flatnonzero(class_scores > score_threshold.reshape(-1)[0])
                picked = _select(corners[candidates], class_scores[candidates], limit, iou)
                selected += [(batch, cls, int(candidates[i])) for i in picked]
        return (np.array(selected, dtype=np.int64).reshape(-1, 3),)

    return run
