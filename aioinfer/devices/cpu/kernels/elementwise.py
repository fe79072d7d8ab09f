"""Elementwise kernels: arithmetic, math functions, comparisons, logic, bits, casts.

Binary operators follow numpy's multidirectional broadcasting, which is what ONNX
specifies from opset 7 on; before that, ``broadcast=1`` with ``axis`` aligned the second
input to the first at ``axis`` (handled by :func:`_legacy_alignment`). Activation
functions and Clip live in :mod:`.activations`.

numpy ufuncs return scalars, not arrays, for 0-d operands; kernels wrap such results
in ``np.asarray`` so that every output is an ndarray.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx
from numpy.polynomial import chebyshev

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel

Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]
Unary = Callable[[np.ndarray], np.ndarray]


# -- binary arithmetic, comparison and logic ----------------------------------------------


def _legacy_alignment(spec: NodeSpec) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """How opset < 7 ``broadcast=1, axis=k`` lines B up with A, or None for numpy rules.

    Without ``axis`` the old rule (B's shape is a suffix of A's) is numpy broadcasting;
    with it, B's dimensions match A's from ``axis`` on, so B gets trailing unit axes.
    """
    axis = spec.attr("axis")
    if spec.opset >= 7 or not spec.attr("broadcast", 0) or axis is None:
        return None

    def align(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        start = axis + a.ndim if axis < 0 else axis
        trailing = a.ndim - start - b.ndim
        if start < 0 or trailing < 0:
            raise ValueError(
                f"{spec.op_type} node {spec.name!r}: cannot broadcast B of shape {b.shape} "
                f"onto A of shape {a.shape} at axis {axis}"
            )
        return b.reshape(b.shape + (1,) * trailing)

    return align


def _register_binary(op_type: str, since: int, fn: Binary) -> None:
    def factory(spec: NodeSpec) -> Kernel:
        align = _legacy_alignment(spec)
        if align is None:
            return lambda a, b: (np.asarray(fn(a, b)),)
        return lambda a, b: (np.asarray(fn(a, align(a, b))),)

    kernel(op_type, since=since)(factory)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Division; integers truncate toward zero as in C (numpy's // floors)."""
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    if a.dtype.kind != "i":
        return np.divide(a, b)
    quotient, remainder = (np.asarray(r) for r in np.divmod(a, b))
    # Floor and truncation differ by one where the division is inexact and negative.
    inexact_negative = (remainder != 0) & ((a < 0) != (b < 0))
    return np.add(quotient, inexact_negative, out=quotient, casting="unsafe")


_BINARY: list[tuple[str, int, Binary]] = [
    ("Add", 1, np.add),
    ("Sub", 1, np.subtract),
    ("Mul", 1, np.multiply),
    ("Div", 1, _divide),
    ("Equal", 1, np.equal),
    ("Less", 1, np.less),
    ("Greater", 1, np.greater),
    ("And", 1, np.logical_and),
    ("Or", 1, np.logical_or),
    ("Xor", 1, np.logical_xor),
    ("LessOrEqual", 12, np.less_equal),
    ("GreaterOrEqual", 12, np.greater_equal),
    ("BitwiseAnd", 18, np.bitwise_and),
    ("BitwiseOr", 18, np.bitwise_or),
    ("BitwiseXor", 18, np.bitwise_xor),
]
for _op, _since, _binary in _BINARY:
    _register_binary(_op, _since, _binary)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a ** b`` in the type of the base, whatever the exponent's type."""
    result = np.asarray(np.power(a, b))
    return result if result.dtype == a.dtype else result.astype(a.dtype)


@kernel("Pow", since=1)
def _pow(spec: NodeSpec) -> Kernel:
    align = _legacy_alignment(spec)
    exponent = spec.const(1)
    if align is None and exponent is not None and exponent.size == 1:
        # A constant scalar exponent stays a Python number, so the base keeps its dtype
        # without a float64 round trip; squaring (the common case) is a multiply.
        value = exponent.item()
        rank = exponent.ndim

        def scalar_pow(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
            if a.ndim < rank:
                return (_power(a, b),)
            if value == 2:
                return (np.asarray(np.square(a)),)
            return (_power(a, value),)

        return scalar_pow
    if align is None:
        return lambda a, b: (_power(a, b),)
    return lambda a, b: (_power(a, align(a, b)),)


@kernel("Mod", since=10)
def _mod(spec: NodeSpec) -> Kernel:
    # fmod=0 takes the divisor's sign (Python/numpy %), fmod=1 the dividend's (C fmod).
    fn = np.fmod if spec.attr("fmod", 0) else np.mod
    return lambda a, b: (np.asarray(fn(a, b)),)


@kernel("BitShift", since=11)
def _bit_shift(spec: NodeSpec) -> Kernel:
    direction = spec.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(
            f"BitShift node {spec.name!r}: direction must be 'LEFT' or 'RIGHT', got {direction!r}"
        )
    # numpy defines shifts by the bit width or more as 0, as ONNX's unsigned types need.
    fn = np.left_shift if direction == "LEFT" else np.right_shift
    return lambda a, b: (np.asarray(fn(a, b)),)


# -- unary math ---------------------------------------------------------------------------


def _erf_tables() -> tuple[tuple[np.ndarray, float, float], tuple[np.ndarray, float, float]]:
    """Polynomials for erf, from Chebyshev interpolation of :func:`math.erf` at import.

    Near zero erf(x) = x * p(x**2) with p interpolating erf(x)/x on x in [0, 2]; beyond,
    erf(x) = 1 - exp(-x**2) * q(x) with q interpolating erfc(x)*exp(x**2) on [2, 6]
    (erfc(6) is below double precision). Both are smooth, so the degrees below reach
    about 1e-14 absolute error. Each entry: monomial coefficients (highest first) in the
    variable mapped to [-1, 1], and that map's scale and shift.
    """

    def interpolate(
        f: Callable[[float], float], lo: float, hi: float, degree: int
    ) -> tuple[np.ndarray, float, float]:
        nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
        values = [f(lo + (hi - lo) * (u + 1) / 2) for u in nodes]
        # degree + 1 Chebyshev nodes: the least-squares fit is the interpolant.
        coeffs = chebyshev.cheb2poly(chebyshev.chebfit(nodes, values, degree))[::-1]
        return coeffs.copy(), 2 / (hi - lo), -(hi + lo) / (hi - lo)

    def erf_over_x(t: float) -> float:
        return math.erf(math.sqrt(t)) / math.sqrt(t) if t > 0 else 2 / math.sqrt(math.pi)

    def scaled_erfc(x: float) -> float:
        return math.erfc(x) * math.exp(x * x)

    return interpolate(erf_over_x, 0.0, 4.0, 16), interpolate(scaled_erfc, 2.0, 6.0, 22)


_ERF_NEAR, _ERF_TAIL = _erf_tables()
_ERF_SPLIT, _ERF_ONE = 2.0, 6.0
_ERF_CHUNK = 1 << 14  # float64 temporaries of one chunk stay in cache


def _horner(table: tuple[np.ndarray, float, float], v: np.ndarray) -> np.ndarray:
    coeffs, scale, shift = table
    u = v * scale
    u += shift
    p = np.full_like(u, coeffs[0])
    for c in coeffs[1:]:
        p *= u
        p += c
    return p


def _erf_chunk(x: np.ndarray, out: np.ndarray) -> None:
    """erf of the float64 vector ``x`` into ``out`` (any numeric dtype)."""
    magnitude = np.abs(x)
    near = magnitude < _ERF_SPLIT
    if near.all():
        out[...] = x * _horner(_ERF_NEAR, x * x)
        return
    result = np.ones_like(x)
    xs = x[near]
    result[near] = xs * _horner(_ERF_NEAR, xs * xs)
    tail = ~near & (magnitude < _ERF_ONE)
    xt = magnitude[tail]
    result[tail] = 1 - np.exp(-xt * xt) * _horner(_ERF_TAIL, xt)
    far = ~near
    result[far] = np.copysign(result[far], x[far])
    result[np.isnan(x)] = np.nan
    out[...] = result


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in ``x``'s dtype (computed in float64)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, x.dtype)
    for start in range(0, flat.size, _ERF_CHUNK):
        stop = start + _ERF_CHUNK
        _erf_chunk(flat[start:stop].astype(np.float64), out[start:stop])
    return out.reshape(x.shape)


_UNARY: list[tuple[str, int, Unary]] = [
    ("Neg", 1, np.negative),
    ("Abs", 1, np.abs),
    ("Reciprocal", 1, np.reciprocal),
    ("Floor", 1, np.floor),
    ("Ceil", 1, np.ceil),
    ("Sqrt", 1, np.sqrt),
    ("Exp", 1, np.exp),
    ("Log", 1, np.log),
    ("Not", 1, np.logical_not),
    ("Sin", 7, np.sin),
    ("Cos", 7, np.cos),
    ("Tan", 7, np.tan),
    ("Asin", 7, np.arcsin),
    ("Acos", 7, np.arccos),
    ("Atan", 7, np.arctan),
    ("Sign", 9, np.sign),
    ("Sinh", 9, np.sinh),
    ("Cosh", 9, np.cosh),
    ("Asinh", 9, np.arcsinh),
    ("Acosh", 9, np.arccosh),
    ("Atanh", 9, np.arctanh),
    ("Erf", 9, erf),
    ("IsNaN", 9, np.isnan),
    ("Round", 11, np.round),  # numpy rounds half to even, as ONNX does
    ("BitwiseNot", 18, np.invert),
]


def _register_unary(op_type: str, since: int, fn: Unary) -> None:
    kernel(op_type, since=since)(lambda spec: lambda x: (np.asarray(fn(x)),))


for _op, _since, _unary in _UNARY:
    _register_unary(_op, _since, _unary)


@kernel("IsInf", since=10)
def _is_inf(spec: NodeSpec) -> Kernel:
    negative = bool(spec.attr("detect_negative", 1))
    positive = bool(spec.attr("detect_positive", 1))
    if negative and positive:
        return lambda x: (np.asarray(np.isinf(x)),)
    if negative:
        return lambda x: (np.asarray(np.isneginf(x)),)
    if positive:
        return lambda x: (np.asarray(np.isposinf(x)),)
    return lambda x: (np.zeros(x.shape, dtype=np.bool_),)


# -- variadic -----------------------------------------------------------------------------


def _fold(ufunc: np.ufunc, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """``ufunc`` over all inputs with broadcasting, reusing the first result as buffer."""
    result = np.asarray(ufunc(inputs[0], inputs[1]))
    for x in inputs[2:]:
        if np.broadcast_shapes(result.shape, x.shape) == result.shape:
            ufunc(result, x, out=result)
        else:
            result = ufunc(result, x)
    return result


CLIP_BOUND_ELEMENTS = 4096
"""Elements from which Max or Min of a float array and a one-element bound runs as
``np.clip``: numpy 2.4 has no SIMD loop for ``np.maximum`` of an array and a scalar
(openWakeWord's embedding, ``Max(x, c)`` after every convolution: 17 us on 24x74x32
floats against 6 us as a clip); below, ``np.maximum`` is the cheaper call."""


def _as_clip(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``ufunc(a, b)`` (maximum or minimum) as a clip of the large operand by the
    one-element one, when both are floats of one dtype and the large one is big enough
    to gain (:data:`CLIP_BOUND_ELEMENTS`); None otherwise. NaN propagates either way."""
    if b.size != 1:
        a, b = b, a
    if (
        b.size != 1
        or a.size < CLIP_BOUND_ELEMENTS
        or a.dtype != b.dtype
        or a.dtype.kind != "f"
        or b.ndim > a.ndim
    ):
        return None
    bound = b.reshape(-1)[0]
    if ufunc is np.maximum:
        return np.clip(a, bound, math.inf)
    return np.clip(a, -math.inf, bound)


def _register_variadic(op_type: str, ufunc: np.ufunc, mean: bool = False) -> None:
    bounded = ufunc in (np.maximum, np.minimum)

    def run(*inputs: np.ndarray) -> tuple[np.ndarray]:
        if len(inputs) == 1:
            return (inputs[0],)
        if bounded and len(inputs) == 2:
            clipped = _as_clip(ufunc, inputs[0], inputs[1])
            if clipped is not None:
                return (clipped,)
        result = _fold(ufunc, inputs)
        if mean:
            result /= len(inputs)
        return (result,)

    kernel(op_type, since=1)(lambda spec: run)


_register_variadic("Sum", np.add)
_register_variadic("Mean", np.add, mean=True)
_register_variadic("Max", np.maximum)
_register_variadic("Min", np.minimum)


@kernel("Where", since=9)
def _where(spec: NodeSpec) -> Kernel:
    return lambda condition, x, y: (np.where(condition, x, y),)


# -- types: Cast, CastLike ----------------------------------------------------------------

_SATURATING = frozenset(
    {
        onnx.TensorProto.FLOAT8E4M3FN,
        onnx.TensorProto.FLOAT8E4M3FNUZ,
        onnx.TensorProto.FLOAT8E5M2,
        onnx.TensorProto.FLOAT8E5M2FNUZ,
    }
)
"""Targets whose out-of-range values clamp to the largest finite value when ``saturate``."""


def _cast_target(spec: NodeSpec) -> int:
    """Cast's ``to`` as a TensorProto data type (a type name before opset 6)."""
    to = spec.attr("to")
    if to is None:
        raise ValueError(f"Cast node {spec.name!r}: missing attribute 'to'")
    if isinstance(to, str):
        try:
            to = onnx.TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise ValueError(f"Cast node {spec.name!r}: unknown type name {to!r}") from None
    if to == onnx.TensorProto.UNDEFINED or to not in onnx.TensorProto.DataType.values():
        raise ValueError(f"Cast node {spec.name!r}: unknown data type {to}")
    return int(to)


@functools.lru_cache(maxsize=256)
def _caster(to: int, saturate: bool, round_mode: str) -> Callable[[np.ndarray], np.ndarray]:
    """The conversion to TensorProto type ``to`` (numpy dtypes; ml_dtypes for the float8,
    4-bit and 2-bit types). ``saturate`` and ``round_mode`` only affect float8 targets."""
    if to == onnx.TensorProto.STRING:
        # Strings are numpy unicode arrays; their item size follows the data.
        return lambda x: x if x.dtype.kind == "U" else x.astype(np.str_)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to))
    if to == onnx.TensorProto.FLOAT8E8M0:
        return lambda x: onnx.numpy_helper.to_float8e8m0(x, saturate, round_mode).astype(dtype)
    if to in _SATURATING and saturate:
        info = ml_dtypes.finfo(dtype)

        def saturating(x: np.ndarray) -> np.ndarray:
            wide = x if x.dtype.kind == "f" else x.astype(np.float32)
            return np.clip(wide, info.min, info.max).astype(dtype)

        return saturating
    return lambda x: x.astype(dtype, copy=False)


@kernel("Cast", since=1)
def _cast_kernel(spec: NodeSpec) -> Kernel:
    saturate = bool(spec.attr("saturate", 1))
    cast = _caster(_cast_target(spec), saturate, spec.attr("round_mode", "up"))
    return lambda x: (cast(x),)


@kernel("CastLike", since=15)
def _cast_like(spec: NodeSpec) -> Kernel:
    saturate = bool(spec.attr("saturate", 1))
    round_mode = spec.attr("round_mode", "up")

    def cast_like(x: np.ndarray, like: np.ndarray) -> tuple[np.ndarray]:
        if like.dtype.kind in "UO":
            to = onnx.TensorProto.STRING
        else:
            to = onnx.helper.np_dtype_to_tensor_dtype(like.dtype)
        return (_caster(to, saturate, round_mode)(x),)

    return cast_like


_NARROW_BITS: dict[int, int] = {
    onnx.TensorProto.INT4: 4,
    onnx.TensorProto.UINT4: 4,
    onnx.TensorProto.FLOAT4E2M1: 4,
    onnx.TensorProto.INT2: 2,
    onnx.TensorProto.UINT2: 2,
    onnx.TensorProto.FLOAT6E2M3: 6,
    onnx.TensorProto.FLOAT6E3M2: 6,
}
"""Types narrower than their one-byte numpy storage (ml_dtypes)."""


def _bit_width(to: int) -> int:
    return _NARROW_BITS.get(to, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to)).itemsize * 8)


@kernel("BitCast", since=26)
def _bitcast(spec: NodeSpec) -> Kernel:
    """BitCast 26: the same bits read as another type of the same width (little endian)."""
    to = _cast_target(spec)
    if to == onnx.TensorProto.STRING:
        raise ValueError(f"BitCast node {spec.name!r}: cannot bit-cast to STRING")
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        source = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
        if _bit_width(source) != _bit_width(to):
            raise ValueError(
                f"BitCast: {x.dtype} ({_bit_width(source)} bits) and {dtype} "
                f"({_bit_width(to)} bits) differ in width"
            )
        return (x.view(dtype),)

    return run


# -- pass-through and constants -----------------------------------------------------------


@kernel("Identity", since=1)
def _identity(spec: NodeSpec) -> Kernel:
    return lambda x: (x,)


@kernel("Dropout", since=1)
def _dropout(spec: NodeSpec) -> Kernel:
    """Dropout is the identity at inference; opset >= 12 may ask for training mode."""
    # Before opset 10 the mask had the data's type; from 10 on it is bool.
    mask_is_bool = spec.opset >= 10
    wants_mask = spec.num_outputs > 1

    def inference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if not wants_mask:
            return (x, None)
        return (x, np.ones(x.shape, dtype=np.bool_ if mask_is_bool else x.dtype))

    if spec.opset < 12:
        return lambda x: inference(x)
    rng = np.random.default_rng(spec.attr("seed"))

    def run(
        x: np.ndarray, ratio: np.ndarray | None = None, training_mode: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        rate = 0.5 if ratio is None else float(ratio)
        if training_mode is None or not bool(training_mode) or rate == 0:
            return inference(x)
        mask = rng.random(x.shape) >= rate
        y = x * mask
        y *= 1 / (1 - rate)
        return (y, mask)

    return run


_CONSTANT_LISTS: dict[str, np.dtype] = {
    "value_float": np.dtype(np.float32),
    "value_floats": np.dtype(np.float32),
    "value_int": np.dtype(np.int64),
    "value_ints": np.dtype(np.int64),
    "value_string": np.dtype(np.str_),
    "value_strings": np.dtype(np.str_),
}


@kernel("Constant", since=1)
def _constant(spec: NodeSpec) -> Kernel:
    if "sparse_value" in spec.attrs:
        raise ValueError(f"Constant node {spec.name!r}: sparse_value is not supported")
    if "value" in spec.attrs:
        value = np.asarray(spec.attrs["value"]).view()
        if value.dtype.kind in "SO":
            # String tensors arrive as bytes; kernels exchange strings as numpy str.
            value = np.char.decode(value.astype(np.bytes_), "utf-8")
    else:
        name = next((n for n in _CONSTANT_LISTS if n in spec.attrs), None)
        if name is None:
            raise ValueError(
                f"Constant node {spec.name!r}: expected one of the attributes value, "
                f"{', '.join(_CONSTANT_LISTS)}; got {sorted(spec.attrs) or 'none'}"
            )
        value = np.array(spec.attrs[name], dtype=_CONSTANT_LISTS[name])
    # The same array is returned on every run, so nobody may write to it.
    value.flags.writeable = False
    return lambda: (value,)


@kernel("Einsum", since=12)
def _einsum(spec: NodeSpec) -> Kernel:
    equation = str(spec.attr("equation", "")).replace(" ", "")
    if not equation:
        raise ValueError(f"Einsum node {spec.name!r}: empty equation")
    # The contraction order depends only on the shapes; plan it once per shape set.
    paths: dict[tuple[tuple[int, ...], ...], list] = {}

    def run(*operands: np.ndarray) -> tuple[np.ndarray]:
        dtype = operands[0].dtype
        if dtype.kind == "V":  # the ml_dtypes floats (bfloat16, ...) run in float32
            operands = tuple(x.astype(np.float32) for x in operands)
        shapes = tuple(x.shape for x in operands)
        path = paths.get(shapes)
        if path is None:
            if len(paths) >= 64:
                paths.clear()
            path = paths[shapes] = np.einsum_path(equation, *operands, optimize="greedy")[0]
        result = np.asarray(np.einsum(equation, *operands, optimize=path))
        return (result.astype(dtype, copy=False),)

    return run
