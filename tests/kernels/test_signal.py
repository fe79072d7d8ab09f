"""DFT, STFT and the window generators against onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

from tests.kernels._check import check_node

TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize(("inverse", "onesided"), [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("length", [None, 6, 12])
@pytest.mark.parametrize("axis", [1, -2])
def test_dft_20(inverse: int, onesided: int, length: int | None, axis: int) -> None:
    rng = np.random.default_rng(0)
    parts = 1 if onesided and not inverse else 2
    x = rng.standard_normal((2, 8, 3, parts)).astype(np.float32)
    inputs = [x, None if length is None else np.int64(length), np.int64(axis)]
    node = oh.make_node(
        "DFT", ["x", "n" if length else "", "axis"], ["y"], inverse=inverse, onesided=onesided
    )
    check_node(node, inputs, opset=20, **TOL)


def test_dft_17_axis_attribute() -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 1)).astype(np.float32)
    check_node(oh.make_node("DFT", ["x"], ["y"], axis=1), [x], opset=17, **TOL)


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("parts", [1, 2])
def test_stft(window: bool, onesided: int, parts: int) -> None:
    rng = np.random.default_rng(2)
    signal = rng.standard_normal((2, 40, parts)).astype(np.float32)
    inputs = [signal, np.int64(6)]
    names = ["signal", "step"]
    if window:
        inputs += [np.hanning(10).astype(np.float32), np.int64(10)]
        names += ["window", "length"]
    else:
        inputs += [None, np.int64(10)]
        names += ["", "length"]
    node = oh.make_node("STFT", names, ["y"], onesided=onesided)
    check_node(node, inputs, opset=17, **TOL)


@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op_type: str, periodic: int) -> None:
    node = oh.make_node(op_type, ["size"], ["y"], periodic=periodic, output_datatype=11)
    check_node(node, [np.int64(10)], opset=17, rtol=1e-12, atol=1e-12)
