"""Small convolutions of one image by constant weights (:mod:`.conv_small`): the columns,
padding and bias bound once per input shape, reused by later calls.

Checked against onnx.reference, with later calls on other inputs (the kept padded
buffer's borders must stay zero, the columns be refilled). Tolerances: float32 rtol and
atol 1e-4 on sums of up to 387 products of standard normal values; float64 1e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels import conv_small
from aioinfer.devices.cpu.kernels.registry import find_kernel, find_out_kernel, make_spec
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import check_from_threads, run_reference

RTOL, ATOL = 1e-4, 1e-4

rng = np.random.default_rng(41)

# (x shape, w shape, attributes): Silero VAD's and openWakeWord's, and geometries the
# bound window view must get right.
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "silero-encoder": ((1, 129, 3), (128, 129, 3), {"pads": [1, 1]}),
    "silero-strided": ((1, 64, 2), (64, 64, 3), {"pads": [1, 1], "strides": [2]}),
    "silero-head": ((1, 128, 1), (1, 128, 1), {}),
    "stft-frames": ((1, 1, 1760), (65, 1, 512), {"strides": [160]}),
    "1d-dilated-asymmetric": ((1, 5, 17), (7, 5, 3), {"pads": [2, 0], "dilations": [3]}),
    "2d-padded": ((1, 6, 9, 7), (5, 6, 3, 3), {"pads": [1, 2, 0, 1], "strides": [2, 1]}),
    "2d-pointwise-strided": ((1, 8, 6, 5), (3, 8, 1, 1), {"strides": [2, 2]}),
}


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _kernel(node: Any, constants: list[np.ndarray | None], planned: bool) -> Any:
    ir_node = ir.from_proto(node)
    entry = find_kernel(ir_node.domain, ir_node.op_type, 18)
    spec = make_spec(ir_node, 18, [None, *constants])
    if planned:
        out_factory = find_out_kernel(entry)
        assert out_factory is not None
        return out_factory(spec)
    return entry.factory(spec)


@pytest.fixture
def small_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The input shapes :class:`SmallConv` computed, call by call."""
    calls: list[tuple[int, ...]] = []
    original = conv_small.SmallConv.__call__

    def counted(self: Any, x: np.ndarray, b: Any, out: Any) -> np.ndarray:
        calls.append(x.shape)
        return original(self, x, b, out)

    monkeypatch.setattr(conv_small.SmallConv, "__call__", counted)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", ["constant", "input", "none"])
@pytest.mark.parametrize("case", list(CASES))
def test_small_conv_matches_reference(
    case: str, bias: str, dtype: type, small_calls: list[tuple[int, ...]], threads: int
) -> None:
    """Three calls on different inputs (the first binds the shape, the others reuse
    it), also into a planned buffer, with the bias constant, given at run time, or none."""
    x_shape, w_shape, attrs = CASES[case]
    w, b = _random(*w_shape, dtype=dtype), _random(w_shape[0], dtype=dtype)
    names = ["x", "w", "b"] if bias != "none" else ["x", "w"]
    node = oh.make_node("Conv", names, ["y"], **attrs)
    constants = [w, b] if bias == "constant" else [w]
    plain, planned = _kernel(node, constants, False), _kernel(node, constants, True)
    tol = RTOL if dtype == np.float32 else 1e-10
    for _ in range(3):
        x = _random(*x_shape, dtype=dtype)
        inputs = [x, w, b][: len(names)]
        want = run_reference(node, inputs, 18)[0]
        got = plain(*inputs)[0]
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        out = np.full(want.shape, np.nan, dtype)
        into = planned(out, *inputs)[0]
        assert into is out
        np.testing.assert_allclose(into, want, rtol=tol, atol=tol)
    assert small_calls == [x_shape] * 6  # the binding calls too


@pytest.mark.parametrize(
    ("activation", "params"), [("Relu", []), ("Sigmoid", []), ("LeakyRelu", [0.2])]
)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("case", ["silero-encoder", "silero-head", "2d-padded"])
def test_small_fused_conv_epilogue(
    activation: str,
    params: list[float],
    residual: bool,
    case: str,
    small_calls: list[tuple[int, ...]],
) -> None:
    """FusedConv through the small path: bias, residual and activation as the unfused
    nodes compute them."""
    x_shape, w_shape, attrs = CASES[case]
    w, b = _random(*w_shape), _random(w_shape[0])
    conv = oh.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    names = ["x", "w", "b", "z"] if residual else ["x", "w", "b"]
    node = oh.make_node(
        "FusedConv",
        names,
        ["y"],
        domain=AIOINFER_DOMAIN,
        activation=activation,
        **({"activation_params": params} if params else {}),
        **attrs,
    )
    kernel = _kernel(node, [w, b], True)
    unfused = oh.make_node(activation, ["c"], ["y"], **dict(zip(["alpha"], params)))
    for _ in range(2):
        x = _random(*x_shape)
        want = run_reference(conv, [x, w, b], 18)[0]
        inputs = [x, w, b]
        if residual:
            inputs.append(_random(*want.shape))
            want = want + inputs[3]
        want = run_reference(unfused, [want], 18)[0]
        got = kernel(np.empty(want.shape, np.float32), *inputs)[0]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert small_calls == [x_shape] * 2


def test_larger_convolutions_take_the_general_path(small_calls: list[tuple[int, ...]]) -> None:
    """Batches, groups, and columns above the kept size do not bind a small convolution."""
    cases = [
        ((2, 129, 3), (128, 129, 3), {"pads": [1, 1]}),
        ((1, 8, 10), (8, 2, 3), {"group": 4}),
        ((1, 64, 40, 40), (8, 64, 3, 3), {"pads": [1] * 4}),
    ]
    for x_shape, w_shape, attrs in cases:
        x, w = _random(*x_shape), _random(*w_shape)
        node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
        kernel = _kernel(node, [w], False)
        want = run_reference(node, [x, w], 18)[0]
        for _ in range(2):
            np.testing.assert_allclose(kernel(x, w)[0], want, rtol=RTOL, atol=ATOL)
    assert small_calls == []


def test_small_conv_from_several_threads() -> None:
    """Requests on several threads share the kernel; each thread binds its own buffers."""
    x_shape, w_shape, attrs = CASES["silero-encoder"]
    w = _random(*w_shape)
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    kernel = _kernel(node, [w], False)
    inputs = [_random(*x_shape) for _ in range(3)]
    want = [run_reference(node, [x, w], 18)[0] for x in inputs]

    def results_of(index: int) -> list[np.ndarray]:
        return [kernel(inputs[index], w)[0].copy() for _ in range(20)]

    check_from_threads(results_of, want, RTOL, ATOL)
