"""Fused kernels: the CPU device's own operators (domain ``ai.aioinfer``, declared in
:mod:`aioinfer.devices.cpu.ops`) that its fusion passes (:mod:`aioinfer.devices.cpu.passes`)
put in place of several ONNX nodes.

- ``FusedConv(X, W, B?, Z?)``: Conv attributes, then ``+ Z`` (a residual) and an
  activation, in place on the convolution's output.
- ``FusedGemm(A, B, C?)``: Gemm attributes plus an activation.
- ``FusedMatMul(A, B, bias?)``: ``alpha * A' @ B' + bias`` with ``transA``/``transB``
  (the last two axes swapped; a folded Transpose) on N-D operands, plus an activation.
- ``Attention(Q, Kt, V, mask?)``: ``softmax(scale * Q @ Kt + mask) @ V`` over the last
  axis, the scores computed and normalised in one buffer.
- ``LayerNormalization(X, scale, bias?)``: over the axes from ``axis`` on, one output.
- ``OneHotMatMul(indices, table)``: ``MatMul(one_hot(indices), W) (+ bias)`` as a lookup of
  rows of ``table`` (``W`` plus the bias, and one more row for indices out of range).
- ``Gelu(X)``: ``x/2 * (1 + erf(x / sqrt 2))``; with ``approximate="tanh"``,
  ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``.

Activations are named by the ``activation`` attribute (``Relu``, ``LeakyRelu``, ``Clip``,
``Sigmoid``, ``Tanh``, ``Gelu``, ``GeluTanh`` (its tanh approximation), ``HardSigmoid``,
``HardSwish``, ``Swish`` (``x * sigmoid(x)``,
SiLU); empty for none) with their
parameters in ``activation_params`` (LeakyRelu: alpha, and optionally a floor, the
constant of a ``Max`` after it; Clip: min, max; HardSigmoid: alpha, beta; HardSwish:
none, or ``[6]`` for six times it). Every kernel here is
registered with the execution type ``"fused"`` (profiling shows it) and has an out form
for the memory planner.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from aioinfer.devices.cpu import ops
from aioinfer.devices.cpu.kernels.activations import (
    gelu32_chunk,
    gelu_approximate,
    gelu_tanh,
    leaky_relu,
    relu,
    sigmoid_scalar,
)
from aioinfer.devices.cpu.kernels.conv import conv_compute
from aioinfer.devices.cpu.kernels.conv_rows import ConvEpilogue
from aioinfer.devices.cpu.kernels.elementwise import erf
from aioinfer.devices.cpu.kernels.matmul import matmul_into, small_gemm
from aioinfer.devices.cpu.kernels.normalization import softmax_last_axis
from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_ELEMENTS,
    intra_op_threads,
    run_parallel,
)
from aioinfer.devices.cpu.kernels.registry import (
    Kernel,
    KernelFactory,
    NodeSpec,
    OutKernel,
    kernel,
    out_kernel,
)

InPlace = Callable[[np.ndarray], object]
"""An activation applied in place to a float array (what it returns is ignored)."""


def _relu(y: np.ndarray) -> None:
    relu(y, out=y)


def _sigmoid(y: np.ndarray) -> None:
    if y.size == 1:
        # A classifier's one score (openWakeWord's, Silero VAD's): in Python floats,
        # 0.4 instead of 5 us (a one-element array pays a ufunc call twice what 128
        # elements do, and the errstate below is 0.7 us more).
        y.fill(sigmoid_scalar(y.item()))
        return
    np.negative(y, out=y)
    with np.errstate(over="ignore"):  # exp overflows to inf: 1 / (1 + inf) is the exact 0
        np.exp(y, out=y)
    y += 1
    np.reciprocal(y, out=y)


def _floored_leaky_relu(y: np.ndarray, alpha: float, floor: float) -> None:
    """``max(LeakyRelu(y), floor)`` for a slope in [0, 1]: ``max(y, max(alpha * y,
    floor))``, the same maxima as the two operators, in three passes (the floor as a
    clip with two bounds: numpy has no SIMD loop for ``np.maximum(array, scalar)``, 18
    against 6 us on openWakeWord's 24x74x32)."""
    scaled = np.multiply(y, y.dtype.type(alpha))
    np.clip(scaled, y.dtype.type(floor), math.inf, out=scaled)
    np.maximum(y, scaled, out=y)


def _tanh(y: np.ndarray) -> None:
    np.tanh(y, out=y)


def _hard_sigmoid(y: np.ndarray, alpha: float, beta: float) -> None:
    y *= alpha
    y += beta
    np.clip(y, 0.0, 1.0, out=y)


def _swish(y: np.ndarray) -> None:
    """``y * sigmoid(y)`` (SiLU) as ``(y / 2) * (1 + tanh(y / 2))``, with one temporary:
    three passes in place and one into the temporary, and tanh cannot overflow. On
    float32 with numpy 2.4 (AVX-512), 173K elements: 62 instead of 96 us for
    ``y / (1 + exp(-y))`` (negate, exp, add, divide), the same largest error against
    float64 (9e-7)."""
    y *= 0.5
    gate = np.tanh(y)
    gate += 1
    y *= gate


def _hard_swish(y: np.ndarray) -> None:
    """``y * clip(y / 6 + 1/2, 0, 1)`` = ``y * (clip(y, -3, 3) + 3) / 6``, with one
    temporary (the slice of a split, or the whole product).

    The gate is made by the clip (``clip(y, -3, 3) + 3`` is ``clip(y + 3, 0, 6)`` bit
    for bit) and then changed in place: with numpy 2.4 on float32, an in-place pass
    over one array takes about half the time of a pass from one array into another, and
    the clip is the slowest pass. 0.86-0.93x the time of adding 3 into a new array and
    clipping it in place (50K-400K elements)."""
    gate = np.clip(y, -3.0, 3.0)
    gate += 3.0
    gate *= 1 / 6
    y *= gate


def _six_hard_swish(y: np.ndarray) -> None:
    """``6 * HardSwish(y)`` = ``y * (clip(y, -3, 3) + 3)``: a HardSwish whose 1/6 the
    weights of the convolutions reading it took (see
    :mod:`aioinfer.devices.cpu.passes.fold_hardswish_scale`), one pass fewer."""
    gate = np.clip(y, -3.0, 3.0)
    gate += 3.0
    y *= gate


_CHUNK = 1 << 16
"""Elements per chunk of the float32 GELU: its temporaries stay in the L2 cache."""
_MIN_CHUNK = 1 << 14
"""Elements of the smallest chunk of a split GELU."""
_GELU_PASSES = 20
"""numpy passes per element of the float32 GELU: the work a split of it weighs (a 64 x
1024 layer is worth splitting, a pass over as many elements is not)."""


def _gelu_into(x: np.ndarray, y: np.ndarray) -> None:
    """``y = x/2 * (1 + erf(x / sqrt 2))``; ``y`` may be ``x`` (contiguous)."""
    if x.dtype != np.float32:
        y[...] = x * (erf(x * math.sqrt(0.5)) + 1) * 0.5
        return
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    # Two chunks per thread at least: an MLP's 64 x 1024 (one whole chunk) ran on one
    # thread.
    chunk = min(_CHUNK, max(_MIN_CHUNK, -(-flat_x.size // (2 * intra_op_threads()))))

    def chunks(first: int, last: int) -> None:
        size = min(chunk, flat_x.size)
        u, t, p = (np.empty(size, np.float32) for _ in range(3))
        for start in range(first * chunk, min(last * chunk, flat_x.size), chunk):
            n = min(chunk, flat_x.size - start)
            x_n, y_n = flat_x[start : start + n], flat_y[start : start + n]
            gelu32_chunk(x_n, y_n, u[:n], t[:n], p[:n])

    run_parallel(chunks, -(-flat_x.size // chunk), work=flat_x.size * _GELU_PASSES)


def _gelu_tanh_gate(x: np.ndarray, gate: np.ndarray) -> None:
    """``gate = 1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))`` (``gate`` is not ``x``),
    with ``x + 0.044715 x^3`` scaled as ``x * (k + 0.044715 k x^2)``: six passes."""
    kind = x.dtype.type
    np.multiply(x, x, out=gate)
    gate *= kind(0.044715 * math.sqrt(2 / math.pi))
    gate += kind(math.sqrt(2 / math.pi))
    gate *= x
    np.tanh(gate, out=gate)
    gate += kind(1)


def _gelu_tanh(y: np.ndarray) -> None:
    """The tanh approximation of GELU in place (see :func:`_gelu_tanh_into`), with one
    temporary."""
    gate = np.empty_like(y)
    _gelu_tanh_gate(y, gate)
    gate *= y.dtype.type(0.5)
    y *= gate


def _gelu(y: np.ndarray) -> None:
    if y.flags.c_contiguous:
        _gelu_into(y, y)
    else:  # a block of a split along an inner axis
        block = np.ascontiguousarray(y)
        _gelu_into(block, block)
        y[...] = block


def activation(spec: NodeSpec) -> InPlace | None:
    """The in-place activation the node's ``activation`` attribute names, or None.

    Raises:
        ValueError: an unknown activation, or wrong parameters for it.
    """
    name = ops.ACTIVATION.read(spec)
    params = [float(p) for p in ops.ACTIVATION_PARAMS.read(spec)]
    if not name:
        return None
    if name == ops.Activation.RELU:
        return _relu
    if name == ops.Activation.SIGMOID:
        return _sigmoid
    if name == ops.Activation.TANH:
        return _tanh
    if name == ops.Activation.GELU:
        return _gelu
    if name == ops.Activation.GELU_TANH:
        return _gelu_tanh
    if name == ops.Activation.LEAKY_RELU and len(params) == 1:
        alpha = params[0]
        return lambda y: leaky_relu(y, alpha, out=y)
    if name == ops.Activation.LEAKY_RELU and len(params) == 2 and 0 <= params[0] <= 1:
        alpha, floor = params
        return lambda y: _floored_leaky_relu(y, alpha, floor)
    if name == ops.Activation.CLIP and len(params) == 2:
        low, high = params
        return lambda y: np.clip(y, low, high, out=y)  # both bounds: numpy's fast loop
    if name == ops.Activation.HARD_SIGMOID and len(params) == 2:
        alpha, beta = params
        return lambda y: _hard_sigmoid(y, alpha, beta)
    if name == ops.Activation.HARD_SWISH and not params:
        return _hard_swish
    if name == ops.Activation.HARD_SWISH and params == [ops.HARD_SWISH_SCALE]:
        return _six_hard_swish
    if name == ops.Activation.SWISH and not params:
        return _swish
    raise ValueError(f"{spec.op_type}: unsupported activation {name!r} with parameters {params}")


@functools.lru_cache(maxsize=1024)
def _term_axes(
    shape: tuple[int, ...], term_shapes: tuple[tuple[int, ...], ...], axis: int
) -> tuple[int | None, ...] | None:
    """How each term of :func:`_finish` meets the split ``axis`` of a product of ``shape``:
    its own axis of the same length (sliced along with the product), or None (it
    broadcasts over that axis and is added whole to every slice). None instead of the
    tuple when the product is 0-d or a term would grow it.

    Cached: a model calls it with the same few shapes on every inference.

    Raises:
        ValueError: a term does not broadcast with the product.
    """
    if not shape or any(np.broadcast_shapes(shape, s) != shape for s in term_shapes):
        return None
    axes = []
    for term_shape in term_shapes:
        term_axis = axis - (len(shape) - len(term_shape))
        matched = term_axis >= 0 and term_shape[term_axis] == shape[axis]
        axes.append(term_axis if matched else None)
    return tuple(axes)


def _finish(
    y: np.ndarray, terms: list[np.ndarray | None], act: InPlace | None, axis: int = 0
) -> tuple[np.ndarray]:
    """Add ``terms`` (biases, residuals) to ``y`` and apply ``act``, in place, in one
    pass per term over slices of ``y`` along ``axis``, split between threads."""
    given = [t for t in terms if t is not None]
    term_axes = _term_axes(y.shape, tuple(t.shape for t in given), axis)
    if term_axes is None:
        # A 0-d product, or a term that grows y: plain numpy broadcasting, no splitting.
        total = y
        for t in given:
            total = total + t
        result = np.array(total, ndmin=1)  # fresh, and 1-D so ufuncs can write into it
        if act is not None:
            act(result)
        return (result.reshape(np.shape(total)),)
    if not given and act is None:
        return (y,)
    if y.size * (len(given) + 1) < MIN_PARALLEL_ELEMENTS:
        # Too small to split (run_parallel would run it whole): no closure, no call.
        for t in given:
            y += t
        if act is not None:
            act(y)
        return (y,)
    length = y.shape[axis]

    def part(start: int, stop: int) -> None:
        if start == 0 and stop == length:  # the whole product (no split): no views
            block, pieces = y, given
        else:
            block = y[(*(slice(None),) * axis, slice(start, stop))]
            pieces = [
                t if t_axis is None else t[(*(slice(None),) * t_axis, slice(start, stop))]
                for t, t_axis in zip(given, term_axes)
            ]
        for piece in pieces:
            block += piece
        if act is not None:
            act(block)

    run_parallel(part, length, work=y.size * (len(given) + 1))
    return (y,)


def _fused(op: ops.Op) -> Callable[[KernelFactory], KernelFactory]:
    return kernel(op.name, since=1, domain=ops.DOMAIN, execution_type="fused")


# -- FusedConv --------------------------------------------------------------------------


def _clip_bounds(spec: NodeSpec) -> tuple[float, float] | None:
    """The bounds of the node's activation when it is a clip (Relu, Clip), else None."""
    name = ops.ACTIVATION.read(spec)
    params = [float(p) for p in ops.ACTIVATION_PARAMS.read(spec)]
    if name == ops.Activation.RELU:
        return (0.0, math.inf)
    if name == ops.Activation.CLIP and len(params) == 2:
        return (params[0], params[1])
    return None


def _fused_conv(spec: NodeSpec, planned: bool) -> Kernel:
    compute = conv_compute(spec)
    act = activation(spec)
    bounds = _clip_bounds(spec)

    def run(
        out: np.ndarray | None,
        x: np.ndarray,
        w: np.ndarray,
        b: np.ndarray | None = None,
        z: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        # Depthwise convolutions and those computed in blocks of rows add Z and apply
        # the activation on each thread's share of their output, while that is in the
        # cache, in the thread that made it; the others leave it to _finish.
        whole = z is None or (z.ndim == x.ndim and z.shape[:2] == (x.shape[0], w.shape[0]))
        useful = z is not None or act is not None
        epilogue = ConvEpilogue(z, act, bounds) if whole and useful else None
        y, applied = compute(x, w, b, out, epilogue)
        if applied:
            return (y,)
        return _finish(y, [z], act, axis=1)

    if planned:
        return run
    return lambda *inputs: run(None, *inputs)


@_fused(ops.FUSED_CONV)
def fused_conv(spec: NodeSpec) -> Kernel:
    """Conv, plus a residual ``Z`` and an activation."""
    return _fused_conv(spec, planned=False)


@out_kernel(fused_conv)
def fused_conv_into(spec: NodeSpec) -> OutKernel:
    """FusedConv writing into a planned buffer."""
    return _fused_conv(spec, planned=True)


# -- FusedGemm and FusedMatMul ----------------------------------------------------------


def _fused_gemm(spec: NodeSpec, planned: bool) -> Kernel:
    alpha = float(spec.attr("alpha", 1.0))
    beta = float(spec.attr("beta", 1.0))
    trans_a = bool(spec.attr("transA", 0))
    trans_b = bool(spec.attr("transB", 0))
    act = activation(spec)
    small = small_gemm(spec)

    def run(
        out: np.ndarray | None, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        y = None if small is None else small(out, a, b, c)
        if y is not None:
            if act is not None:
                act(y)
            return (y,)
        y = matmul_into(a.T if trans_a else a, b.T if trans_b else b, out)
        if alpha != 1.0:
            y *= y.dtype.type(alpha)
        if c is not None and beta != 1.0:
            c = c * y.dtype.type(beta) if beta != 0.0 else None
        return _finish(y, [c], act)

    if planned:
        return run
    return lambda *inputs: run(None, *inputs)


@_fused(ops.FUSED_GEMM)
def fused_gemm(spec: NodeSpec) -> Kernel:
    """Gemm (2-D, float), plus an activation."""
    return _fused_gemm(spec, planned=False)


@out_kernel(fused_gemm)
def fused_gemm_into(spec: NodeSpec) -> OutKernel:
    """FusedGemm writing into a planned buffer."""
    return _fused_gemm(spec, planned=True)


def _last_two_swapped(x: np.ndarray) -> np.ndarray:
    return x.swapaxes(-1, -2) if x.ndim >= 2 else x


def _fused_matmul(spec: NodeSpec, planned: bool) -> Kernel:
    alpha = float(ops.ALPHA.read(spec))
    trans_a = bool(ops.TRANS_A.read(spec))
    trans_b = bool(ops.TRANS_B.read(spec))
    act = activation(spec)

    def run(
        out: np.ndarray | None, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        if trans_a:
            a = _last_two_swapped(a)
        if trans_b:
            b = _last_two_swapped(b)
        y = matmul_into(a, b, out)
        if alpha != 1.0:
            y *= y.dtype.type(alpha)
        return _finish(y, [bias], act)

    if planned:
        return run
    return lambda *inputs: run(None, *inputs)


@_fused(ops.FUSED_MATMUL)
def fused_matmul(spec: NodeSpec) -> Kernel:
    """MatMul with folded transposes, a scale, a bias and an activation."""
    return _fused_matmul(spec, planned=False)


@out_kernel(fused_matmul)
def fused_matmul_into(spec: NodeSpec) -> OutKernel:
    """FusedMatMul writing into a planned buffer."""
    return _fused_matmul(spec, planned=True)


# -- Attention --------------------------------------------------------------------------


def _softmax_last(scores: np.ndarray) -> None:
    """Softmax over the last axis, in place."""
    softmax_last_axis(scores, out=scores)


def _attention(spec: NodeSpec, planned: bool) -> Kernel:
    scale = float(ops.SCALE.read(spec))

    def scores_of(q: np.ndarray, kt: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        scores = np.matmul(q, kt)
        if scale != 1.0:
            scores *= scores.dtype.type(scale)
        if mask is not None:
            if np.broadcast_shapes(scores.shape, mask.shape) == scores.shape:
                scores += mask
            else:
                scores = scores + mask
        _softmax_last(scores)
        return scores

    def run(
        out: np.ndarray | None,
        q: np.ndarray,
        kt: np.ndarray,
        v: np.ndarray,
        mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        batch = np.broadcast_shapes(q.shape[:-2], kt.shape[:-2], v.shape[:-2])
        axis = next((i for i, n in enumerate(batch) if n > 1), None)
        score_shape = (*batch, q.shape[-2], kt.shape[-1])
        if (
            min(q.ndim, kt.ndim, v.ndim) < 3
            or axis is None
            or (mask is not None and np.broadcast_shapes(score_shape, mask.shape) != score_shape)
        ):
            return (matmul_into(scores_of(q, kt, mask), v, out),)
        # Every (batch, head) is independent: split them between threads, each part
        # computing its scores, softmax and product in one small buffer.
        shape = (*batch, q.shape[-2], v.shape[-1])
        dtype = np.result_type(q, kt, v)
        if out is None or out.shape != shape or out.dtype != dtype:
            out = np.empty(shape, dtype)
        q, kt, v = (np.broadcast_to(t, (*batch, *t.shape[-2:])) for t in (q, kt, v))
        masks = None if mask is None else np.broadcast_to(mask, score_shape)
        lead = (slice(None),) * axis

        def part(start: int, stop: int) -> None:
            index = (*lead, slice(start, stop))
            scores = scores_of(q[index], kt[index], None if masks is None else masks[index])
            np.matmul(scores, v[index], out=out[index])

        work = int(np.prod(score_shape)) + out.size
        run_parallel(part, batch[axis], work=work)
        return (out,)

    if planned:
        return run
    return lambda *inputs: run(None, *inputs)


@_fused(ops.ATTENTION)
def attention(spec: NodeSpec) -> Kernel:
    """Scaled dot-product attention with an optional additive mask."""
    return _attention(spec, planned=False)


@out_kernel(attention)
def attention_into(spec: NodeSpec) -> OutKernel:
    """Attention writing into a planned buffer."""
    return _attention(spec, planned=True)


# -- LayerNormalization and Gelu --------------------------------------------------------


def _layer_norm(spec: NodeSpec, planned: bool) -> Kernel:
    axis = int(ops.AXIS.read(spec))
    epsilon = float(ops.EPSILON.read(spec))
    last = axis in (-1, 1)  # for a 2-D input: normalised over its last axis

    def run(
        out: np.ndarray | None, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        if (
            x.ndim == 2
            and x.shape[0] == 1
            and last
            and x.dtype == np.float32
            and scale.ndim == 1
            and (bias is None or bias.ndim == 1)
        ):
            # A classifier's 1xN row (openWakeWord's 1x128, twice per inference) without
            # the general path's reshapes: 3.5 instead of 4.7 us.
            if out is None or out.shape != x.shape or out.dtype != x.dtype:
                out = np.empty(x.shape, dtype=x.dtype)
            x_row, y = x[0], out[0]
            width = max(x.shape[1], 1)
            np.subtract(x_row, np.float32(float(np.add.reduce(x_row)) / width), out=y)
            y *= np.float32(1 / math.sqrt(float(np.dot(y, y)) / width + epsilon))
            y *= scale
            if bias is not None:
                y += bias
            return (out,)
        start = axis + x.ndim if axis < 0 else axis
        width = math.prod(x.shape[start:])
        rows = x.reshape(-1, width)
        if out is None or out.shape != x.shape or out.dtype != x.dtype:
            out = np.empty(x.shape, dtype=x.dtype)
        target = out.reshape(rows.shape)
        gamma = scale.reshape(-1)
        beta = None if bias is None else bias.reshape(-1)

        def part(start: int, stop: int) -> None:
            x_rows, y = rows[start:stop], target[start:stop]
            # np.add.reduce and a scale, not .mean(): its Python wrapper costs 2 us.
            mean = np.add.reduce(x_rows, axis=1, keepdims=True)
            mean *= 1 / max(width, 1)
            np.subtract(x_rows, mean, out=y)
            variance = np.einsum("ij,ij->i", y, y)
            variance *= 1 / max(width, 1)
            variance += epsilon
            np.sqrt(variance, out=variance)
            np.reciprocal(variance, out=variance)
            y *= variance[:, None].astype(y.dtype, copy=False)
            y *= gamma
            if beta is not None:
                y += beta

        if rows.shape[0] == 1 and rows.dtype == np.float32:
            # One row (a wake-word classifier's 1x128): its statistics as Python floats
            # (in double precision) save five numpy calls of ~0.7 us each.
            x_row, y = rows[0], target[0]
            np.subtract(x_row, np.float32(float(np.add.reduce(x_row)) / max(width, 1)), out=y)
            inv_std = 1 / math.sqrt(float(np.dot(y, y)) / max(width, 1) + epsilon)
            y *= np.float32(inv_std)
            y *= gamma
            if beta is not None:
                y += beta
        elif rows.size < MIN_PARALLEL_ELEMENTS:
            part(0, rows.shape[0])
        else:
            run_parallel(part, rows.shape[0], work=rows.size)
        return (out,)

    if planned:
        return run
    return lambda *inputs: run(None, *inputs)


@_fused(ops.LAYER_NORMALIZATION)
def layer_normalization(spec: NodeSpec) -> Kernel:
    """LayerNormalization (a fused decomposed pattern): only the normalised output."""
    return _layer_norm(spec, planned=False)


@out_kernel(layer_normalization)
def layer_normalization_into(spec: NodeSpec) -> OutKernel:
    """LayerNormalization writing into a planned buffer."""
    return _layer_norm(spec, planned=True)


_TANH_PASSES = 8
"""numpy passes per element of :func:`_gelu_tanh_into`."""


def _gelu_tanh_into(x: np.ndarray, y: np.ndarray) -> None:
    """``y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`` (see
    :func:`_gelu_tanh_gate`): eight in-place passes over chunks that stay in the L2
    cache, split between the threads; ``y`` is not ``x`` (contiguous)."""
    if x.dtype not in (np.float32, np.float64):
        y[...] = gelu_tanh(x.astype(np.float32))
        return
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    half = x.dtype.type(0.5)
    chunk = min(_CHUNK, max(_MIN_CHUNK, -(-flat_x.size // (2 * intra_op_threads()))))

    def chunks(first: int, last: int) -> None:
        for start in range(first * chunk, min(last * chunk, flat_x.size), chunk):
            x_n, y_n = flat_x[start : start + chunk], flat_y[start : start + chunk]
            _gelu_tanh_gate(x_n, y_n)
            y_n *= x_n
            y_n *= half

    run_parallel(chunks, -(-flat_x.size // chunk), work=flat_x.size * _TANH_PASSES)


def _gelu_kernel(spec: NodeSpec, planned: bool) -> Kernel:
    approximate = gelu_approximate(spec)
    into = _gelu_into if approximate == "none" else _gelu_tanh_into

    def run(out: np.ndarray | None, x: np.ndarray) -> tuple[np.ndarray]:
        if out is None or out.shape != x.shape or out.dtype != x.dtype or out is x:
            out = np.empty(x.shape, dtype=x.dtype)
        into(np.ascontiguousarray(x), out)
        return (out,)

    if planned:
        return run
    return lambda x: run(None, x)


@_fused(ops.GELU)
def gelu(spec: NodeSpec) -> Kernel:
    """GELU with the exact (erf) definition, or with ``approximate="tanh"`` its tanh
    approximation."""
    return _gelu_kernel(spec, planned=False)


@out_kernel(gelu)
def gelu_into(spec: NodeSpec) -> OutKernel:
    """Gelu writing into a planned buffer."""
    return _gelu_kernel(spec, planned=True)


# -- OneHotMatMul -----------------------------------------------------------------------


def _one_hot_matmul(planned: bool) -> Kernel:
    def run(out: np.ndarray | None, indices: np.ndarray, table: np.ndarray) -> tuple[np.ndarray]:
        if indices.ndim < 1 or indices.shape[-1] != 1 or indices.dtype.kind not in "iu":
            raise ValueError(
                f"OneHotMatMul: indices must be integers with a last axis of 1, got "
                f"{indices.dtype} of shape {indices.shape}"
            )
        rows = table.shape[0] - 1
        flat = indices.reshape(-1)
        if flat.size and (np.minimum.reduce(flat) < 0 or np.maximum.reduce(flat) >= rows):
            flat = np.where((flat >= 0) & (flat < rows), flat, rows)
        shape = (*indices.shape[:-1], table.shape[1])
        if out is None or out.shape != shape or out.dtype != table.dtype:
            out = np.empty(shape, table.dtype)
        np.take(table, flat, axis=0, out=out.reshape(-1, table.shape[1]))
        return (out,)

    if planned:
        return run
    return lambda indices, table: run(None, indices, table)


@_fused(ops.ONE_HOT_MATMUL)
def one_hot_matmul(spec: NodeSpec) -> Kernel:
    """``MatMul(one_hot(indices), W) (+ bias)`` as a row lookup (see
    :mod:`aioinfer.devices.cpu.passes.fold_one_hot`): row ``i`` of ``table`` for each index
    ``i`` in ``[0, K)``, its last row (row ``K``) for the others."""
    return _one_hot_matmul(planned=False)


@out_kernel(one_hot_matmul)
def one_hot_matmul_into(spec: NodeSpec) -> OutKernel:
    """OneHotMatMul writing into a planned buffer."""
    return _one_hot_matmul(planned=True)
