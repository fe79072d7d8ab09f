"""Normalization kernels and the softmax family against onnx.reference.

Where onnx.reference does not follow the spec (Softmax before opset 13 is not coerced to
2-D; BatchNormalization fails at 7, mixes in batch statistics at 9 and fails in training
mode before 14; LRN loops over the batch instead of the channels; LpNormalization p=1
ignores signs), the expectation comes from the reference at another opset or on an
equivalent input, or is written out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.kernels._check import check_node, run_aioinfer, run_reference

TOLERANCE = {
    np.float16: {"rtol": 1e-2, "atol": 1e-2},
    np.float32: {"rtol": 1e-5, "atol": 1e-5},
    np.float64: {"rtol": 1e-10, "atol": 1e-12},
}


def _randn(shape: Sequence[int], dtype: type = np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _positive(shape: Sequence[int], dtype: type = np.float32, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(dtype)


def _run_with_consts(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int, const: Sequence[int]
) -> list[np.ndarray]:
    """Run ``node`` with the inputs at positions ``const`` known at compile time."""
    ir_node = ir.from_proto(node)
    consts = [x if i in const else None for i, x in enumerate(inputs)]
    entry = find_kernel(ir_node.domain, ir_node.op_type, opset)
    return list(entry.factory(make_spec(ir_node, opset, consts))(*inputs))


def _assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# --- BatchNormalization -------------------------------------------------------------------


def _bn_inputs(shape: Sequence[int], dtype: type = np.float32) -> list[np.ndarray]:
    c = shape[1]
    return [
        _randn(shape, dtype),
        _positive((c,), dtype, seed=2),
        _randn((c,), dtype, seed=3),
        _randn((c,), dtype, seed=4) * 0.5,
        _positive((c,), dtype, seed=5),
    ]


BN_NAMES = ["x", "scale", "bias", "mean", "var"]


@pytest.mark.parametrize(
    ("opset", "attrs"), [(6, {"is_test": 1}), (7, {}), (9, {}), (14, {}), (15, {})]
)
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4, 5), (1, 3, 2, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("constant_params", [False, True])
def test_batch_norm_inference(
    opset: int, attrs: dict, shape: tuple, dtype: type, constant_params: bool
) -> None:
    node = oh.make_node("BatchNormalization", BN_NAMES, ["y"], epsilon=1e-3, **attrs)
    inputs = _bn_inputs(shape, dtype)
    const = (1, 2, 3, 4) if constant_params else ()
    (got,) = _run_with_consts(node, inputs, opset, const)
    # Inference is the same in every version; the reference gets it right at 6, 14, 15.
    if opset in (6, 14, 15):
        want = run_reference(node, inputs, opset)[0]
    else:
        node15 = oh.make_node("BatchNormalization", BN_NAMES, ["y"], epsilon=1e-3)
        want = run_reference(node15, inputs, 15)[0]
    _assert_close(got, want, **TOLERANCE[dtype])


def test_batch_norm_mixed_parameter_dtype() -> None:
    # Opset 15: float16 data with float32 scale, bias and statistics gives float16.
    x, *params = _bn_inputs((2, 3, 4), np.float32)
    inputs = [x.astype(np.float16), *params]
    node = oh.make_node("BatchNormalization", BN_NAMES, ["y"])
    check_node(node, inputs, opset=15, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 4, 5)])
def test_batch_norm_training_mode(opset: int, shape: tuple) -> None:
    node = oh.make_node(
        "BatchNormalization", BN_NAMES, ["y", "running_mean", "running_var"], training_mode=1
    )
    check_node(node, _bn_inputs(shape), opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("opset", "attrs"), [(6, {"is_test": 0}), (7, {}), (9, {})])
def test_batch_norm_training_five_outputs(opset: int, attrs: dict) -> None:
    # Y and the running statistics as in opset 15; then the batch statistics.
    inputs = _bn_inputs((3, 2, 4, 5))
    outputs = ["y", "mean_out", "var_out", "saved_mean", "saved_var"]
    node = oh.make_node("BatchNormalization", BN_NAMES, outputs, momentum=0.8, **attrs)
    got = _run_with_consts(node, inputs, opset, const=())
    node15 = oh.make_node(
        "BatchNormalization", BN_NAMES, outputs[:3], momentum=0.8, training_mode=1
    )
    want = run_reference(node15, inputs, 15)
    x = inputs[0]
    want += [x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))]
    assert len(got) == 5
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_batch_norm_6_single_output_is_inference() -> None:
    # is_test=0 with nowhere to write the statistics runs as inference.
    inputs = _bn_inputs((2, 3, 4))
    node = oh.make_node("BatchNormalization", BN_NAMES, ["y"], is_test=0)
    (got,) = _run_with_consts(node, inputs, 6, const=())
    node15 = oh.make_node("BatchNormalization", BN_NAMES, ["y"])
    _assert_close(got, run_reference(node15, inputs, 15)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [6, 7])
@pytest.mark.parametrize("flat_params", [False, True])
def test_batch_norm_per_activation(opset: int, flat_params: bool) -> None:
    # spatial=0: one parameter per activation (C x H x W), broadcast over the batch only.
    x = _randn((2, 3, 4, 2))
    param_shape = (24,) if flat_params else (3, 4, 2)
    scale, bias = _positive(param_shape, seed=2), _randn(param_shape, seed=3)
    mean, var = _randn(param_shape, seed=4), _positive(param_shape, seed=5)
    node = oh.make_node("BatchNormalization", BN_NAMES, ["y"], spatial=0, is_test=1)
    if opset == 7:
        node = oh.make_node("BatchNormalization", BN_NAMES, ["y"], spatial=0)
    (got,) = _run_with_consts(node, [x, scale, bias, mean, var], opset, const=())
    shaped = [p.reshape(3, 4, 2) for p in (scale, bias, mean, var)]
    want = (x - shaped[2]) / np.sqrt(shaped[3] + 1e-5) * shaped[0] + shaped[1]
    _assert_close(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_batch_norm_per_activation_training() -> None:
    x = _randn((5, 3, 2))
    params = [_positive((3, 2), seed=2), _randn((3, 2), seed=3)]
    params += [_randn((3, 2), seed=4), _positive((3, 2), seed=5)]
    outputs = ["y", "mean_out", "var_out", "saved_mean", "saved_var"]
    node = oh.make_node("BatchNormalization", BN_NAMES, outputs, spatial=0, momentum=0.5)
    got = _run_with_consts(node, [x, *params], 7, const=())
    batch_mean, batch_var = x.mean(axis=0), x.var(axis=0)
    want = [
        (x - batch_mean) / np.sqrt(batch_var + 1e-5) * params[0] + params[1],
        0.5 * params[2] + 0.5 * batch_mean,
        0.5 * params[3] + 0.5 * batch_var,
        batch_mean,
        batch_var,
    ]
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_batch_norm_does_not_modify_inputs() -> None:
    inputs = _bn_inputs((2, 3, 4))
    copies = [a.copy() for a in inputs]
    node = oh.make_node("BatchNormalization", BN_NAMES, ["y", "m", "v"], training_mode=1)
    _run_with_consts(node, inputs, 15, const=())
    for a, b in zip(inputs, copies, strict=True):
        np.testing.assert_array_equal(a, b)


# --- LayerNormalization -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "scale_shape"),
    [
        ((2, 3, 4), -1, (4,)),
        ((2, 3, 4), 1, (3, 4)),
        ((2, 3, 4), 1, (4,)),
        ((2, 3, 4), 0, (2, 3, 4)),
        ((2, 3, 4), -2, (1, 4)),
        ((6,), 0, (6,)),
        ((2, 1, 3, 1, 4), 2, (3, 1, 4)),
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_layer_norm(shape: tuple, axis: int, scale_shape: tuple, with_bias: bool) -> None:
    inputs = [_randn(shape), _positive(scale_shape)]
    names = ["x", "scale"]
    if with_bias:
        inputs.append(_randn(scale_shape, seed=3))
        names.append("bias")
    node = oh.make_node(
        "LayerNormalization", names, ["y", "mean", "inv_std"], axis=axis, epsilon=1e-3
    )
    check_node(node, inputs, opset=17, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("opset", [17, 23])
def test_layer_norm_dtypes(dtype: type, opset: int) -> None:
    inputs = [_randn((3, 5, 8), dtype), _positive((8,), dtype), _randn((8,), dtype, seed=2)]
    node = oh.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"])
    check_node(node, inputs, opset=opset, **TOLERANCE[dtype])


def test_layer_norm_float16_statistics_are_stash_type() -> None:
    # With stash_type=1 the optional Mean and InvStdDev outputs are float32 (ONNX
    # type inference); the reference returns them as float16.
    x = _randn((3, 8), np.float16)
    node = oh.make_node("LayerNormalization", ["x", "scale"], ["y", "mean", "inv_std"])
    y, mean, inv_std = run_aioinfer(node, [x, np.ones(8, np.float16)], 17)
    assert (y.dtype, mean.dtype, inv_std.dtype) == (np.float16, np.float32, np.float32)
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(mean, x32.mean(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(inv_std, 1 / np.sqrt(x32.var(axis=1, keepdims=True) + 1e-5), 1e-5)


# --- InstanceNormalization, GroupNormalization --------------------------------------------


@pytest.mark.parametrize("opset", [1, 6, 22])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_instance_norm(opset: int, shape: tuple, dtype: type) -> None:
    c = shape[1]
    inputs = [_randn(shape, dtype), _positive((c,), dtype), _randn((c,), dtype, seed=2)]
    node = oh.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-4)
    check_node(node, inputs, opset=opset, **TOLERANCE[dtype])


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("shape", [(2, 4, 3), (2, 4, 3, 2), (1, 4, 2, 1, 3)])
def test_group_norm(opset: int, groups: int, shape: tuple) -> None:
    # Opset 18 takes scale and bias per group, 21 per channel.
    width = groups if opset == 18 else shape[1]
    inputs = [_randn(shape), _positive((width,)), _randn((width,), seed=2)]
    node = oh.make_node(
        "GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups, epsilon=1e-3
    )
    check_node(node, inputs, opset=opset, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_group_norm_21_dtypes(dtype: type) -> None:
    inputs = [_randn((2, 6, 5), dtype), _positive((6,), dtype), _randn((6,), dtype, seed=2)]
    node = oh.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3)
    # stash_type=1: the reference computes the statistics of float64 data in float32.
    check_node(node, inputs, opset=21, **TOLERANCE[np.float32 if dtype == np.float64 else dtype])


def test_group_norm_rejects_indivisible_channels() -> None:
    node = oh.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=4)
    inputs = [_randn((1, 6, 2)), np.ones(6, np.float32), np.zeros(6, np.float32)]
    with pytest.raises(ValueError, match="6 channels"):
        run_aioinfer(node, inputs, 21)


# --- LRN, MeanVarianceNormalization, LpNormalization --------------------------------------


def _lrn_by_channel(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN written out from the spec, one channel at a time."""
    y = np.empty_like(x)
    lower, upper = (size - 1) // 2, math.ceil((size - 1) / 2)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - lower) : min(x.shape[1], c + upper + 1)]
        square_sum = np.sum(window.astype(np.float64) ** 2, axis=1)
        y[:, c] = x[:, c] / (bias + alpha / size * square_sum) ** beta
    return y


LRN_ATTRS = [{}, {"alpha": 0.01, "beta": 0.5, "bias": 2.0}, {"alpha": 1.0, "beta": 1.0}]


@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("attrs", LRN_ATTRS)
def test_lrn(opset: int, size: int, attrs: dict) -> None:
    # The reference is right only when the batch is as large as the channel count.
    node = oh.make_node("LRN", ["x"], ["y"], size=size, **attrs)
    check_node(node, [_randn((6, 6, 3, 4))], opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("attrs", LRN_ATTRS)
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 3, 5), (2, 5, 2, 3, 2), (3, 2)])
def test_lrn_shapes(size: int, attrs: dict, shape: tuple) -> None:
    x = _randn(shape)
    (got,) = run_aioinfer(oh.make_node("LRN", ["x"], ["y"], size=size, **attrs), [x], 13)
    full = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0} | attrs
    _assert_close(got, _lrn_by_channel(x, size, **full), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_lrn_dtypes(dtype: type) -> None:
    # The reference divides the float32 alpha attribute by size in float32.
    node = oh.make_node("LRN", ["x"], ["y"], size=3, alpha=0.1)
    tolerance = TOLERANCE[np.float16] if dtype == np.float16 else {"rtol": 1e-7, "atol": 0}
    check_node(node, [_randn((5, 5, 2, 2), dtype)], opset=13, **tolerance)


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize(
    ("shape", "axes"),
    [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1]), ((2, 3, 4, 5), [0, 1, 2, 3]), ((4, 6), [-1])],
)
def test_mean_variance_normalization(opset: int, shape: tuple, axes: list[int] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    node = oh.make_node("MeanVarianceNormalization", ["x"], ["y"], **attrs)
    # The reference computes E[x^2] - E[x]^2, which loses a few float32 digits.
    check_node(node, [_randn(shape)], opset=opset, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the reference divides 0/0
@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lp_normalization(opset: int, axis: int, p: int, dtype: type) -> None:
    # Positive data: the reference forgets the absolute value for p=1.
    x = _positive((3, 4, 5), dtype) if p == 1 else _randn((3, 4, 5), dtype)
    x[1, 2] = 0  # an all-zero slice along the last axis gives zeros
    node = oh.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p)
    check_node(node, [x], opset=opset, **TOLERANCE[dtype])


def test_lp_normalization_l1_of_negative_values() -> None:
    x = np.array([[3.0, -1.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    (got,) = run_aioinfer(oh.make_node("LpNormalization", ["x"], ["y"], p=1), [x], 22)
    _assert_close(got, np.array([[0.75, -0.25, 0], [0, 0, 0]], np.float32), 1e-6, 0)


def test_lp_normalization_rejects_p3() -> None:
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        run_aioinfer(oh.make_node("LpNormalization", ["x"], ["y"], p=3), [_randn((2,))], 22)


# --- Softmax, LogSoftmax, Hardmax ---------------------------------------------------------

SOFTMAX_OPS = ["Softmax", "LogSoftmax", "Hardmax"]


def _softmax_input(op: str, shape: Sequence[int], dtype: type = np.float32) -> np.ndarray:
    if op == "Hardmax":
        # Few distinct values, so that ties pick the first maximum.
        return np.random.default_rng(4).integers(0, 3, shape).astype(dtype)
    return _randn(shape, dtype) * 3


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("opset", [13, 23])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [
        ((3, 4, 5), None),
        ((3, 4, 5), 0),
        ((3, 4, 5), 1),
        ((3, 4, 5), -2),
        ((7,), 0),
        ((2, 1, 3, 1, 4), 3),
        ((2, 1, 3, 1, 4), -3),
    ],
)
def test_softmax_per_axis(op: str, opset: int, shape: tuple, axis: int | None) -> None:
    attrs = {} if axis is None else {"axis": axis}
    node = oh.make_node(op, ["x"], ["y"], **attrs)
    check_node(node, [_softmax_input(op, shape)], opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_softmax_dtypes(op: str, dtype: type) -> None:
    node = oh.make_node(op, ["x"], ["y"])
    check_node(node, [_softmax_input(op, (4, 9), dtype)], opset=13, **TOLERANCE[dtype])


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((3, 4, 5), None), ((3, 4, 5), 0), ((3, 4, 5), 2), ((3, 4, 5), -1), ((2, 1, 3, 2, 2), 2)],
)
def test_softmax_coerced_to_2d(op: str, opset: int, shape: tuple, axis: int | None) -> None:
    # Before opset 13 the input is flattened to [prod(shape[:axis]), rest] (axis 1 by
    # default) and each row is normalized as a whole.
    if opset == 1 and axis is not None and axis < 0:
        axis += len(shape)
    x = _softmax_input(op, shape)
    attrs = {} if axis is None else {"axis": axis}
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"], **attrs), [x], opset)
    start = 1 if axis is None else axis % len(shape)
    rows = x.reshape(math.prod(shape[:start]), -1)
    want = run_reference(oh.make_node(op, ["x"], ["y"], axis=1), [rows], 13)[0]
    _assert_close(got, want.reshape(shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_empty(op: str, opset: int) -> None:
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"]), [np.zeros((0, 3), np.float32)], opset)
    assert got.shape == (0, 3) and got.dtype == np.float32


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 3, 16, 128), (5, 77), (1, 1), (3, 2, 1000)])
def test_softmax_last_axis_matches_float64(op: str, dtype: type, shape: tuple) -> None:
    """(Log)Softmax over the last axis (fmax shift, sums by BLAS) against float64 numpy,
    with masked (-inf) keys, a NaN (its row is NaN, the others are not) and a row of -inf
    (NaN, as numpy's softmax gives)."""
    x = _randn(shape, dtype) * 8
    flat = x.reshape(-1, shape[-1])
    flat[:, ::3] = -np.inf
    flat[:, -1] = 1.0  # every other row keeps a finite key
    if flat.shape[0] > 2:
        flat[1, shape[-1] // 2] = np.nan
        flat[2] = -np.inf
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"]), [x], 13)
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        shifted = wide - wide.max(axis=-1, keepdims=True)
        total = np.exp(shifted).sum(axis=-1, keepdims=True)
        want = np.exp(shifted) / total if op == "Softmax" else shifted - np.log(total)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, **TOLERANCE[dtype])


def test_softmax_is_stable_for_large_values() -> None:
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]], np.float32)
    (soft,) = run_aioinfer(oh.make_node("Softmax", ["x"], ["y"]), [x], 13)
    np.testing.assert_allclose(soft, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], atol=1e-7)
    (log,) = run_aioinfer(oh.make_node("LogSoftmax", ["x"], ["y"]), [x], 13)
    np.testing.assert_allclose(log[0], [-np.log(2), -np.log(2), -2000 - np.log(2)], 1e-6)
