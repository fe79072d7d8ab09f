"""Activation kernels: Relu and its relatives, sigmoid-like functions, Gelu, Clip.

Attribute values stay Python floats so that numpy keeps the input's float type (a numpy
float64 scalar would promote float32 data). Functions made of several numpy steps run
float16 data in float32 and round once at the end, as a fused kernel would. They work
in place on their temporaries, so 0-d data (for which ufuncs return scalars) runs as
shape (1,).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from aioinfer.devices.cpu.kernels.elementwise import erf
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel

Unary = Callable[[np.ndarray], np.ndarray]


def _unary_kernel(fn: Unary, widen_half: bool = True) -> Kernel:
    """The kernel computing ``fn``: float16 data in float32 (``widen_half``), 0-d as 1-D."""

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        if x.ndim == 0:
            return (run(x.reshape(1))[0].reshape(()),)
        if widen_half and x.dtype == np.float16:
            return (fn(x.astype(np.float32)).astype(np.float16),)
        return (fn(x),)

    return run


# -- the Relu family ----------------------------------------------------------------------


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``max(x, 0)`` (NaN stays NaN), into ``out`` when given (it may be ``x``).

    ``np.clip`` with two bounds: with numpy 2.4, ``np.maximum(x, 0)`` and a one-sided
    clip take 3-7x longer on float32 data (measured on 0.8M elements). Up to
    :data:`SMALL_RELU` elements ``np.maximum`` with a zero of ``x``'s type is the faster
    call (128 floats: 0.5 against 1.8 us; a wake-word head's layers)."""
    if x.dtype.kind == "f" and x.size > SMALL_RELU:
        return np.clip(x, 0.0, math.inf, out=out)
    return np.maximum(x, x.dtype.type(0), out=out)


SMALL_RELU = 4096
"""Elements up to which ``np.maximum`` beats ``np.clip`` for Relu (8192: 3.2 against 2.5
us; 1024: 0.8 against 1.9 us)."""


def leaky_relu(x: np.ndarray, alpha: float, out: np.ndarray | None = None) -> np.ndarray:
    """``x`` where positive, else ``alpha * x``; into ``out`` when given (may be ``x``)."""
    if 0 <= alpha <= 1:
        # For a slope in [0, 1] the larger of x and alpha*x is the right branch (an
        # array-array maximum: 5-20x faster than np.where or a masked copy).
        scaled = np.multiply(x, alpha)
        return np.maximum(x, scaled, out=scaled if out is None else out)
    # Else x + (alpha - 1) * min(x, 0): only clips and products, no masks.
    negative = np.clip(x, -math.inf, 0.0)
    negative *= alpha - 1
    return np.add(x, negative, out=negative if out is None else out)


@kernel("Relu", since=1)
def _relu(spec: NodeSpec) -> Kernel:
    return _unary_kernel(relu, widen_half=False)


@kernel("LeakyRelu", since=1)
def _leaky_relu(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 0.01))
    return _unary_kernel(lambda x: leaky_relu(x, alpha), widen_half=False)


def _slope_for(x_shape: tuple[int, ...], slope: np.ndarray, name: str) -> np.ndarray:
    """Line a 1-D slope up with the channel axis when it does not broadcast as is.

    Models converted from PyTorch give a slope of shape [C] for NCHW data; numpy would
    align it with W. Like the reference implementation, use the axis of size C: axis 1
    when it matches, else the only axis that does.
    """
    size = slope.shape[0]
    if len(x_shape) > 1 and x_shape[1] == size:
        axis = 1
    else:
        matches = [i for i, d in enumerate(x_shape) if d == size]
        if len(matches) != 1:
            raise ValueError(
                f"PRelu node {name!r}: slope of shape {slope.shape} does not broadcast to "
                f"input of shape {x_shape}"
            )
        axis = matches[0]
    return slope.reshape((size,) + (1,) * (len(x_shape) - axis - 1))


@kernel("PRelu", since=1)
def _prelu(spec: NodeSpec) -> Kernel:
    def run(x: np.ndarray, slope: np.ndarray) -> tuple[np.ndarray]:
        if (
            slope.ndim == 1
            and slope.shape[0] != 1
            and (x.ndim == 0 or slope.shape[0] != x.shape[-1])
        ):
            slope = _slope_for(x.shape, slope, spec.name)
        return (np.where(x > 0, x, x * slope),)

    return run


@kernel("ThresholdedRelu", since=10)
def _thresholded_relu(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 1.0))
    return lambda x: (np.where(x > alpha, x, 0),)


def _exp_linear(x: np.ndarray, alpha: float, divisor: float = 1.0) -> np.ndarray:
    """x for x > 0, else alpha * (exp(x / divisor) - 1); exp sees no positive values."""
    negative = np.minimum(x, 0)
    if divisor != 1:
        negative /= divisor
    np.expm1(negative, out=negative)
    negative *= alpha
    return np.where(x > 0, x, negative)


@kernel("Elu", since=1)
def _elu(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 1.0))
    return _unary_kernel(lambda x: _exp_linear(x, alpha))


@kernel("Selu", since=1)
def _selu(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 1.67326319217681884765625))
    gamma = float(spec.attr("gamma", 1.05070102214813232421875))

    def selu(x: np.ndarray) -> np.ndarray:
        y = _exp_linear(x, alpha)
        y *= gamma
        return y

    return _unary_kernel(selu)


@kernel("Celu", since=12)
def _celu(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 1.0))
    return _unary_kernel(lambda x: _exp_linear(x, alpha, divisor=alpha))


@kernel("Shrink", since=9)
def _shrink(spec: NodeSpec) -> Kernel:
    bias = float(spec.attr("bias", 0.0))
    lambd = float(spec.attr("lambd", 0.5))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        y = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
        return (y.astype(x.dtype, copy=False),)

    return run


# -- sigmoid-like -------------------------------------------------------------------------


def sigmoid_scalar(v: float) -> float:
    """``1 / (1 + exp(-v))`` in double precision, never overflowing."""
    if v >= 0:
        return 1 / (1 + math.exp(-v))
    e = math.exp(v)
    return e / (1 + e)


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``1 / (1 + exp(-x))``, into ``out`` when given (it may be ``x``)."""
    e = np.negative(x, out=out)
    # exp(-x) overflows to inf for very negative x, and 1 / (1 + inf) is the exact 0.
    with np.errstate(over="ignore"):
        np.exp(e, out=e)
    e += 1
    return np.reciprocal(e, out=e)


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), which cannot overflow."""
    y = np.exp(np.negative(np.abs(x)))
    np.log1p(y, out=y)
    y += np.maximum(x, 0)
    return y


def _softsign(x: np.ndarray) -> np.ndarray:
    d = np.abs(x)
    d += 1
    return np.divide(x, d, out=d)


def _mish(x: np.ndarray) -> np.ndarray:
    y = np.tanh(_softplus(x))
    y *= x
    return y


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    y = x * alpha
    y += beta
    return np.clip(y, 0, 1, out=y)


@kernel("Sigmoid", since=1)
def _sigmoid_kernel(spec: NodeSpec) -> Kernel:
    return _unary_kernel(sigmoid)


@kernel("Tanh", since=1)
def _tanh(spec: NodeSpec) -> Kernel:
    return _unary_kernel(np.tanh, widen_half=False)


@kernel("Softplus", since=1)
def _softplus_kernel(spec: NodeSpec) -> Kernel:
    return _unary_kernel(_softplus)


@kernel("Softsign", since=1)
def _softsign_kernel(spec: NodeSpec) -> Kernel:
    return _unary_kernel(_softsign)


@kernel("Mish", since=18)
def _mish_kernel(spec: NodeSpec) -> Kernel:
    return _unary_kernel(_mish)


@kernel("HardSigmoid", since=1)
def _hard_sigmoid_kernel(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 0.2))
    beta = float(spec.attr("beta", 0.5))
    return _unary_kernel(lambda x: _hard_sigmoid(x, alpha, beta))


@kernel("HardSwish", since=14)
def _hard_swish(spec: NodeSpec) -> Kernel:
    def hard_swish(x: np.ndarray) -> np.ndarray:
        y = _hard_sigmoid(x, 1 / 6, 0.5)
        y *= x
        return y

    return _unary_kernel(hard_swish)


def _swish(x: np.ndarray, alpha: float) -> np.ndarray:
    y = sigmoid(x * x.dtype.type(alpha))
    y *= x
    return y


@kernel("Swish", since=24)
def _swish_kernel(spec: NodeSpec) -> Kernel:
    alpha = float(spec.attr("alpha", 1.0))
    return _unary_kernel(lambda x: _swish(x, alpha))


@kernel("SwiGLU", since=28)
def _swiglu(spec: NodeSpec) -> Kernel:
    """SwiGLU 28: ``Swish_alpha(A) * B`` for a gate A and a value B of the same shape."""
    alpha = float(spec.attr("alpha", 1.0))

    def run(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
        if a.shape != b.shape:
            raise ValueError(f"SwiGLU: A {a.shape} and B {b.shape} must have the same shape")
        wide = a.astype(np.float32) if a.dtype == np.float16 else a
        y = _swish(np.atleast_1d(wide), alpha).reshape(a.shape)
        return ((y * b).astype(a.dtype, copy=False),)

    return run


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _gelu(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))."""
    y = erf(x * _SQRT_HALF)
    y += 1
    y *= x
    y *= 0.5
    return y


_GELU_P = np.float32(0.3275911 * _SQRT_HALF)
_GELU_A = tuple(  # A&S 7.1.26's a5 ... a1, halved (Q is half of erfc)
    np.float32(0.5 * a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)
)
_GELU_CLIP = np.float32(20.0)


def gelu32_chunk(
    x: np.ndarray, out: np.ndarray, u: np.ndarray, t: np.ndarray, p: np.ndarray
) -> None:
    """Exact (erf) GELU of the float32 vector ``x`` into ``out`` (which may be ``x``),
    with three temporaries of its size (``u``, ``t``, ``p``: a chunk that stays in the
    L2 cache).

    ``x * Phi(x) = max(x, 0) - |x| * Q(|x|)``, where ``Q = erfc(|x|/sqrt 2) / 2`` by
    Abramowitz & Stegun 7.1.26, ``t * poly(t) * exp(-x**2/2)`` with
    ``t = 1 / (1 + p |x| / sqrt 2)`` (absolute error below 4e-7 in float32). No sign
    pass (``np.copysign`` costs as much as ``np.exp`` here) and no ``x/2 * (1 + erf)``
    tail: 20 numpy passes where ``x/2 * (1 + erf(x/sqrt 2))`` took 23, 12% less time.
    ``|x|`` is clipped at 20, where ``Q`` is 0, so that ``x = inf`` gives ``inf``.
    """
    np.clip(x, -_GELU_CLIP, _GELU_CLIP, out=u)
    np.abs(u, out=u)
    np.multiply(u, _GELU_P, out=t)
    t += np.float32(1)
    np.reciprocal(t, out=t)
    np.multiply(t, _GELU_A[0], out=p)
    for coefficient in _GELU_A[1:]:
        p += coefficient
        p *= t
    np.multiply(u, np.float32(-0.5), out=t)
    t *= u
    np.exp(t, out=t)
    p *= t
    p *= u
    np.clip(x, np.float32(0), np.float32(np.inf), out=out)
    out -= p


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    y = x * x
    y *= 0.044715
    y += 1
    y *= x
    y *= _SQRT_2_OVER_PI
    np.tanh(y, out=y)
    y += 1
    y *= x
    y *= 0.5
    return y


def gelu_approximate(spec: NodeSpec) -> str:
    """A Gelu node's ``approximate`` attribute: ``"none"`` (erf) or ``"tanh"``."""
    approximate = spec.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ValueError(
            f"Gelu node {spec.name!r}: approximate must be 'none' or 'tanh', got {approximate!r}"
        )
    return str(approximate)


@kernel("Gelu", since=20)
def _gelu_kernel(spec: NodeSpec) -> Kernel:
    approximate = gelu_approximate(spec)
    return _unary_kernel(_gelu if approximate == "none" else gelu_tanh)


# -- Clip ---------------------------------------------------------------------------------


def _clip(
    x: np.ndarray, low: np.ndarray | float | None, high: np.ndarray | float | None
) -> np.ndarray:
    if low is None and high is None:
        return x
    y = np.empty_like(x)  # as out=, also keeps 0-d results arrays
    if x.dtype.kind == "f":
        # Both bounds given: numpy's fast clip loop (a one-sided clip or maximum/minimum
        # is 3-7x slower on float32). A NaN bound propagates as with maximum/minimum.
        np.clip(
            x,
            -math.inf if low is None else low,
            math.inf if high is None else high,
            out=y,
        )
        return y
    if low is not None:
        np.maximum(x, low, out=y)
    if high is not None:
        np.minimum(x if low is None else y, high, out=y)
    return y


def _bound(value: np.ndarray | None) -> np.ndarray | None:
    """A Clip bound as a 0-d array (exporters sometimes give shape [1])."""
    if value is None or value.ndim == 0:
        return value
    if value.size != 1:
        raise ValueError(f"Clip: min and max must be scalars, got shape {value.shape}")
    return value.reshape(())


@kernel("Clip", since=1)
def _clip_kernel(spec: NodeSpec) -> Kernel:
    if spec.opset < 11:
        low, high = spec.attr("min"), spec.attr("max")
        low = None if low is None else float(low)
        high = None if high is None else float(high)
        return lambda x: (_clip(x, low, high),)
    const_low, const_high = _bound(spec.const(1)), _bound(spec.const(2))
    if (spec.num_inputs < 2 or const_low is not None) and (
        spec.num_inputs < 3 or const_high is not None
    ):
        return lambda x, *_: (_clip(x, const_low, const_high),)

    def run(
        x: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        return (_clip(x, _bound(low), _bound(high)),)

    return run
