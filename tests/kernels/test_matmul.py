"""MatMul, Gemm and MatMulInteger against onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.registry import find_kernel, find_out_kernel, make_spec
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import check_node, run_aioinfer, run_reference

RTOL, ATOL = 1e-4, 1e-5

rng = np.random.default_rng(20240611)


def _random(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -5
        return rng.integers(low, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# -- MatMul ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 6)),
        ((3, 4), (2, 4, 5)),
        ((4,), (2, 4, 5)),
        ((2, 3, 4), (4,)),
        ((2, 1, 2, 1, 3, 4), (2, 1, 4, 2)),
        ((1, 1), (1, 1)),
        ((0, 4), (4, 3)),
        ((3, 0), (0, 4)),
        ((2, 0, 4), (4, 3)),
    ],
)
@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...], opset: int) -> None:
    node = oh.make_node("MatMul", ["a", "b"], ["y"])
    check_node(node, [_random(a_shape), _random(b_shape)], opset=opset, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_dtypes(dtype: type) -> None:
    node = oh.make_node("MatMul", ["a", "b"], ["y"])
    check_node(node, [_random((2, 3, 4), dtype), _random((4, 5), dtype)], 13, rtol=1e-12, atol=0)


def test_matmul_float16_is_computed_in_float32() -> None:
    node = oh.make_node("MatMul", ["a", "b"], ["y"])
    a, b = _random((3, 16), np.float16), _random((16, 2), np.float16)
    check_node(node, [a, b], opset=13, rtol=1e-2, atol=1e-2)
    got = run_aioinfer(node, [a, b], 13)[0]
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_matmul_rejects_mismatched_inner_dims() -> None:
    node = oh.make_node("MatMul", ["a", "b"], ["y"])
    with pytest.raises(ValueError):
        run_aioinfer(node, [_random((3, 4)), _random((5, 2))], 13)


# -- Gemm --------------------------------------------------------------------------------

C_SHAPES = {"none": None, "scalar": (), "one": (1,), "row": (5,), "row2d": (1, 5), "col": (3, 1)}


@pytest.mark.parametrize("c_kind", [*C_SHAPES, "full"])
@pytest.mark.parametrize(("trans_a", "trans_b"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.5, -2.0), (2.0, 0.0)])
def test_gemm_opset13(trans_a: int, trans_b: int, alpha: float, beta: float, c_kind: str) -> None:
    m, k, n = 3, 4, 5
    a = _random((k, m) if trans_a else (m, k))
    b = _random((n, k) if trans_b else (k, n))
    c_shape = (m, n) if c_kind == "full" else C_SHAPES[c_kind]
    inputs = [a, b] + ([] if c_shape is None else [_random(c_shape)])
    node = oh.make_node(
        "Gemm",
        ["a", "b", "c"][: len(inputs)],
        ["y"],
        alpha=alpha,
        beta=beta,
        transA=trans_a,
        transB=trans_b,
    )
    check_node(node, inputs, opset=13, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [7, 9, 11])
@pytest.mark.parametrize("c_shape", [(5,), (3, 5), (3, 1), ()])
def test_gemm_unidirectional_broadcast(opset: int, c_shape: tuple[int, ...]) -> None:
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=1.5, beta=0.25, transB=1)
    check_node(
        node, [_random((3, 4)), _random((5, 4)), _random(c_shape)], opset, rtol=RTOL, atol=ATOL
    )


BROADCAST_CASES = [(1, (5,), 0.5), (1, (1, 5), 2.0), (1, (3, 5), 1.0), (0, (3, 5), 1.0)]


@pytest.mark.parametrize(("broadcast", "c_shape", "beta"), BROADCAST_CASES)
def test_gemm_broadcast_attribute_opset6(
    broadcast: int, c_shape: tuple[int, ...], beta: float
) -> None:
    node = oh.make_node(
        "Gemm", ["a", "b", "c"], ["y"], broadcast=broadcast, alpha=0.5, beta=beta, transA=1
    )
    check_node(node, [_random((4, 3)), _random((4, 5)), _random(c_shape)], 6, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("broadcast", "c_shape", "beta"), BROADCAST_CASES)
def test_gemm_opset1(broadcast: int, c_shape: tuple[int, ...], beta: float) -> None:
    # onnx.reference has no Gemm-1; its definition is Gemm-6's.
    a, b, c = _random((4, 3)), _random((4, 5)), _random(c_shape)
    node = oh.make_node(
        "Gemm", ["a", "b", "c"], ["y"], broadcast=broadcast, alpha=0.5, beta=beta, transA=1
    )
    got = run_aioinfer(node, [a, b, c], 1)[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, 0.5 * a.T @ b + beta * c, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64, np.float64])
def test_gemm_dtypes(dtype: type) -> None:
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1)
    inputs = [_random((4, 3), dtype), _random((4, 5), dtype), _random((5,), dtype)]
    check_node(node, inputs, opset=13, rtol=1e-12, atol=0)


def test_gemm_integer_scaling_casts_the_sum_once() -> None:
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=0.5)
    a = np.array([[1, 2], [3, 4]], dtype=np.int32)
    b = np.array([[1, 0], [0, 1]], dtype=np.int32)
    c = np.array([1, 1], dtype=np.int32)
    got = check_node(node, [a, b, c], opset=13, rtol=0, atol=0)[0]
    np.testing.assert_array_equal(got, np.array([[1, 1], [2, 2]], dtype=np.int32))


def test_gemm_empty_rows() -> None:
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"])
    check_node(node, [_random((0, 4)), _random((4, 5)), _random((5,))], opset=13)


def test_gemm_output_is_not_c() -> None:
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"])
    c = _random((3, 5))
    c_before = c.copy()
    got = run_aioinfer(node, [_random((3, 4)), _random((4, 5)), c], 13)[0]
    np.testing.assert_array_equal(c, c_before)
    assert not np.shares_memory(got, c)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 4), (5, 5)), ((3, 4, 1), (4, 5))])
def test_gemm_rejects_bad_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    node = oh.make_node("Gemm", ["a", "b"], ["y"])
    with pytest.raises(ValueError):
        run_aioinfer(node, [_random(a_shape), _random(b_shape)], 13)


def test_gemm_rejects_c_that_does_not_broadcast() -> None:
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"])
    with pytest.raises(ValueError, match="does not broadcast"):
        run_aioinfer(node, [_random((3, 4)), _random((4, 5)), _random((2, 3, 5))], 13)


# -- MatMulInteger -----------------------------------------------------------------------


def _quantized(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((3, 4), (4, 5)), ((2, 3, 64), (64, 5)), ((2, 3, 4), (2, 4, 5))]
)
@pytest.mark.parametrize("zero_points", ["none", "a", "b", "both"])
def test_matmul_integer(
    a_dtype: type,
    b_dtype: type,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    zero_points: str,
) -> None:
    inputs = [_quantized(a_shape, a_dtype), _quantized(b_shape, b_dtype)]
    names = ["a", "b"]
    if zero_points != "none":
        names.append("a_zero" if zero_points in ("a", "both") else "")
        inputs.append(_quantized((), a_dtype) if zero_points in ("a", "both") else None)
    if zero_points in ("b", "both"):
        names.append("b_zero")
        inputs.append(_quantized((b_shape[-1],), b_dtype))
    node = oh.make_node("MatMulInteger", names, ["y"])
    got = check_node(node, inputs, opset=10, rtol=0, atol=0)[0]
    assert got.dtype == np.int32


def test_matmul_integer_per_row_a_zero_point() -> None:
    a = _quantized((3, 4), np.uint8)
    b = _quantized((4, 2), np.int8)
    a_zero = np.array([1, 200, 7], dtype=np.uint8)
    node = oh.make_node("MatMulInteger", ["a", "b", "a_zero"], ["y"])
    got = run_aioinfer(node, [a, b, a_zero], 10)[0]
    want = (a.astype(np.int32) - a_zero.astype(np.int32)[:, None]) @ b.astype(np.int32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_matmul_integer_large_sums_are_exact() -> None:
    a = np.full((2, 4096), 255, dtype=np.uint8)
    b = np.full((4096, 3), 127, dtype=np.int8)
    node = oh.make_node("MatMulInteger", ["a", "b"], ["y"])
    got = run_aioinfer(node, [a, b], 10)[0]
    np.testing.assert_array_equal(got, np.full((2, 3), 255 * 127 * 4096, dtype=np.int32))


# -- Gemm with constant B and C (the small-product path) --------------------------------


def _constant_gemm(node: onnx.NodeProto, consts: list[np.ndarray | None], planned: bool):
    """The node's kernel (or out form) compiled with ``consts`` as its constant inputs,
    as the compiler binds initializers."""
    ir_node = ir.from_proto(node)
    entry = find_kernel(ir_node.domain, ir_node.op_type, 13)
    spec = make_spec(ir_node, 13, consts)
    if planned:
        out_factory = find_out_kernel(entry)
        assert out_factory is not None
        return out_factory(spec)
    return entry.factory(spec)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("c_shape", [(7,), (1, 7), (1,), (), None])
@pytest.mark.parametrize("rows", [1, 3, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_constant_operands(
    trans_b: int, beta: float, c_shape: tuple[int, ...] | None, rows: int, dtype: type
) -> None:
    """Gemm with initializer B and C (a classifier's layer), plain and into a planned
    buffer, against onnx.reference; the buffer holds the result."""
    b = _random((7, 5) if trans_b else (5, 7), dtype)
    c = None if c_shape is None else _random(c_shape, dtype)
    a = _random((rows, 5), dtype)
    names = ["a", "b"] if c is None else ["a", "b", "c"]
    node = oh.make_node("Gemm", names, ["y"], transB=trans_b, beta=beta)
    inputs = [a, b] if c is None else [a, b, c]
    want = check_node(node, inputs, opset=13, rtol=RTOL, atol=ATOL)[0]
    consts = [None, b, c]
    (got,) = _constant_gemm(node, consts, planned=False)(*inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert got.dtype == dtype and got.shape == (rows, 7)
    buffer = np.full((rows, 7), np.nan, dtype)
    (into,) = _constant_gemm(node, consts, planned=True)(buffer, *inputs)
    assert into is buffer
    np.testing.assert_allclose(into, want, rtol=RTOL, atol=ATOL)
    # A buffer of another shape (other input shapes than when memory was planned).
    (fresh,) = _constant_gemm(node, consts, planned=True)(np.empty((9, 7), dtype), *inputs)
    np.testing.assert_allclose(fresh, want, rtol=RTOL, atol=ATOL)


def test_gemm_constant_operands_other_values_at_run_time() -> None:
    """Operands that are not the compile-time constants (another B, a C fed at run time,
    an A of other width) take the general path: right values or its error."""
    b, c = _random((5, 7)), _random((7,))
    node = oh.make_node("Gemm", ["a", "b", "c"], ["y"])
    run = _constant_gemm(node, [None, b, c], planned=False)
    a = _random((2, 5))
    other_b, other_c = _random((5, 7)), _random((2, 7))
    for b_in, c_in in [(other_b, c), (b, other_c), (other_b, other_c)]:
        (got,) = run(a, b_in, c_in)
        np.testing.assert_allclose(got, a @ b_in + c_in, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError):
        run(_random((2, 4)), b, c)


@pytest.mark.parametrize("activation", ["", "Relu", "Sigmoid"])
def test_fused_gemm_constant_operands(activation: str) -> None:
    """FusedGemm with initializer B and C (openWakeWord's 1x128 @ 128x1 head) against
    onnx.reference's Gemm and activation."""
    b, c = _random((1, 128)), _random((1,))
    node = oh.make_node(
        "FusedGemm",
        ["a", "b", "c"],
        ["y"],
        domain=AIOINFER_DOMAIN,
        transB=1,
        activation=activation,
    )
    for rows in (1, 4):
        a = _random((rows, 128))
        (want,) = run_reference(
            oh.make_node("Gemm", ["a", "b", "c"], ["g"], transB=1), [a, b, c], 13
        )
        if activation == "Relu":
            want = np.maximum(want, 0)
        elif activation == "Sigmoid":
            want = 1 / (1 + np.exp(-want.astype(np.float64)))
        ir_node = ir.from_proto(node)
        entry = find_kernel(AIOINFER_DOMAIN, "FusedGemm", 1)
        (got,) = entry.factory(make_spec(ir_node, 1, [None, b, c]))(a, b, c)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
