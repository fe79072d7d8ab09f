"""Resize's nearest upsampling by whole factors (one repeat and one broadcast copy instead
of a ``np.take`` per axis), against ``onnx.reference``."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.kernels import resize
from tests.kernels._check import check_node


def _scales_node(**attributes: object) -> object:
    return oh.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", **attributes)


@pytest.mark.parametrize(
    ("shape", "scales"),
    [
        ((1, 3, 4, 5), (1, 1, 2, 2)),  # both spatial axes, the last one by np.repeat
        ((2, 4, 5, 7), (1, 1, 2, 3)),  # different factors
        ((1, 96, 3, 4), (1, 1, 8, 8)),  # a feature pyramid's largest step
        ((1, 3, 4, 5), (1, 1, 3, 1)),  # a middle axis only: the broadcast copy alone
        ((1, 3, 4, 5), (1, 1, 1, 4)),  # the last axis only: np.repeat alone
        ((2, 3, 4), (1, 2, 2)),  # 1-D maps
        ((1, 2, 2, 3, 3), (1, 1, 2, 2, 2)),  # 3-D maps
        ((2, 3, 4, 5), (2, 1, 1, 2)),  # the batch axis too
    ],
)
@pytest.mark.parametrize(
    ("coordinates", "rounding"),
    [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("align_corners", "floor")],
)
def test_whole_factor_upsampling_matches_the_reference(
    shape: tuple[int, ...], scales: tuple[int, ...], coordinates: str, rounding: str
) -> None:
    node = _scales_node(coordinate_transformation_mode=coordinates, nearest_mode=rounding)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    check_node(node, [x, None, np.array(scales, np.float32)], opset=19, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.float64])
def test_whole_factor_upsampling_keeps_the_dtype(dtype: type) -> None:
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).astype(dtype)
    node = _scales_node(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    check_node(node, [x, None, np.array([1, 1, 2, 4], np.float32)], opset=19, rtol=0, atol=0)


def test_sizes_that_are_whole_multiples_take_the_repeat() -> None:
    node = oh.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 5)).astype(np.float32)
    check_node(node, [x, None, None, np.array([1, 2, 6, 20], np.int64)], opset=19, atol=0)


@pytest.mark.parametrize(
    ("scales", "coordinates"),
    [
        ((1, 1, 1.5, 2), "asymmetric"),
        ((1, 1, 2, 2), "pytorch_half_pixel"),
        ((1, 1, 0.5, 2), "asymmetric"),
    ],
)
def test_other_nearest_resizes_still_match(scales: tuple[float, ...], coordinates: str) -> None:
    node = _scales_node(coordinate_transformation_mode=coordinates, nearest_mode="floor")
    x = np.random.default_rng(2).standard_normal((1, 2, 6, 5)).astype(np.float32)
    check_node(node, [x, None, np.array(scales, np.float32)], opset=19, rtol=0, atol=0)


def test_plans_mark_whole_repeats_only() -> None:
    """The fast path is chosen from the taps: whole repeats of every position in order,
    and nothing else (a 1.5x enlargement, a reduction, a crop outside the input)."""
    options = resize._Options("nearest", "asymmetric", "floor")
    _, plans = resize._plan(options, (1, 2, 4, 5), None, (1.0, 1.0, 2.0, 3.0), None)
    assert [(plan.axis, plan.repeat) for plan in plans] == [(2, 2), (3, 3)]
    _, plans = resize._plan(options, (1, 2, 4, 6), None, (1.0, 1.0, 1.5, 0.5), None)
    assert [plan.repeat for plan in plans] == [0, 0]
    crop = resize._Options("nearest", "tf_crop_and_resize", "floor")
    roi = (0.0, 0.0, -0.5, -0.5, 1.0, 1.0, 1.5, 1.5)
    _, plans = resize._plan(crop, (1, 1, 3, 3), roi, (1.0, 1.0, 2.0, 2.0), None)
    assert all(plan.repeat == 0 for plan in plans)


def test_a_cropped_resize_with_extrapolation_still_matches() -> None:
    node = oh.make_node(
        "Resize",
        ["x", "roi", "scales"],
        ["y"],
        mode="nearest",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-7.0,
    )
    x = np.random.default_rng(3).standard_normal((1, 1, 3, 3)).astype(np.float32)
    roi = np.array([0, 0, -0.5, -0.5, 1, 1, 1.5, 1.5], np.float32)
    check_node(node, [x, roi, np.array([1, 1, 2, 2], np.float32)], opset=19, atol=0)
