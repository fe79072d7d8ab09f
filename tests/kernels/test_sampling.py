"""GridSample and AffineGrid against onnx.reference (float32: rtol 1e-5, atol 1e-5)."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

from tests.kernels._check import check_node, run_aioinfer, run_reference


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(mode: str, padding_mode: str, align_corners: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.7, 1.7, (2, 3, 4, 2)).astype(np.float32)  # some points outside
    node = oh.make_node(
        "GridSample",
        ["x", "grid"],
        ["y"],
        mode=mode,
        padding_mode=padding_mode,
        align_corners=align_corners,
    )
    check_node(node, [x, grid], opset=22, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding_mode", ["zeros", "reflection"])
def test_grid_sample_3d(mode: str, padding_mode: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 3, 4, 3)).astype(np.float32)
    grid = rng.uniform(-1.3, 1.3, (1, 2, 3, 2, 3)).astype(np.float32)
    node = oh.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding_mode)
    check_node(node, [x, grid], opset=22, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("old", "new"), [("bilinear", "linear"), ("bicubic", "cubic")])
def test_grid_sample_16_mode_names(old: str, new: str) -> None:
    """GridSample-16 calls the modes bilinear and bicubic (the reference knows only the
    newer names, so it computes the expected values with those)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    grid = rng.uniform(-1, 1, (1, 2, 2, 2)).astype(np.float32)
    (got,) = run_aioinfer(oh.make_node("GridSample", ["x", "grid"], ["y"], mode=old), [x, grid], 16)
    (want,) = run_reference(
        oh.make_node("GridSample", ["x", "grid"], ["y"], mode=new), [x, grid], 22
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 2, 3, 4, 2]])
def test_affine_grid(align_corners: int, size: list[int]) -> None:
    rank = len(size) - 2
    theta = np.random.default_rng(3).standard_normal((size[0], rank, rank + 1))
    node = oh.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align_corners)
    check_node(node, [theta.astype(np.float32), np.int64(size)], opset=20, rtol=1e-5, atol=1e-5)
