"""Recurrent kernels: RNN, GRU and LSTM (opset 7 on; ``layout`` from opset 14).

Every attribute of the operators is supported: ``direction`` (forward, reverse,
bidirectional), ``activations`` with ``activation_alpha`` / ``activation_beta``, ``clip``,
``hidden_size``, ``layout``, LSTM's ``input_forget`` and GRU's ``linear_before_reset``;
inputs ``sequence_lens``, ``initial_h``, ``initial_c`` and the LSTM peepholes ``P``.

The input projection of all time steps (and both directions) is one matrix product;
only the recurrence loops over time, each step a product over the whole batch. The
common LSTM (default activations, no peepholes, clip, ``input_forget`` or uneven
lengths) takes a leaner loop, :func:`_lstm_fast`: nine numpy calls per step (for both
directions of a small bidirectional one; the directions of a large one on two intra-op
threads) on preallocated, contiguous, gate-major buffers; the common GRU likewise
(:mod:`.gru_fast`, twelve calls per step). With
``sequence_lens``, a sequence shorter than the others keeps its state past its end and
its ``Y`` rows there are zero; the reverse direction reads each sequence backwards from
its own last element. float16 data is computed in float32 and rounded once at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from aioinfer.devices.cpu.kernels.conv import compute_dtype
from aioinfer.devices.cpu.kernels.gru_fast import (
    GruWeights,
    gru_fast,
    gru_fast_weights,
    project_steps,
)
from aioinfer.devices.cpu.kernels.lstm_loop import lstm_loop
from aioinfer.devices.cpu.kernels.parallel import run_parallel
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel
from aioinfer.devices.cpu.plan import CANCEL_EVERY, current_cancel_token, stop_if_cancelled
from aioinfer.plugin.sync_request import CancelToken

Activation = Callable[[np.ndarray], np.ndarray]
State = tuple[np.ndarray, ...]
Step = Callable[[np.ndarray, State], State]
"""One time step of one direction: (input projection at t, state) -> new state; the new
state's first element is the hidden state ``H_t``."""


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 0.5 * (1 + tanh(x / 2)) is the logistic function without exp's overflow.
    y = np.tanh(x * 0.5)
    y += 1
    y *= 0.5
    return y


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(x * alpha + beta, 0, 1)


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


_ACTIVATIONS: dict[str, tuple[float | None, float | None, Callable[..., np.ndarray]]] = {
    # lower-case name: (default alpha or None when unused, default beta or None, fn)
    "relu": (None, None, lambda x: np.maximum(x, 0)),
    "tanh": (None, None, np.tanh),
    "sigmoid": (None, None, _sigmoid),
    "affine": (1.0, 0.0, lambda x, a, b: x * a + b),
    "leakyrelu": (0.01, None, lambda x, a: np.where(x >= 0, x, x * a)),
    "thresholdedrelu": (1.0, None, lambda x, a: np.where(x > a, x, 0)),
    "scaledtanh": (1.0, 1.0, lambda x, a, b: a * np.tanh(x * b)),
    "hardsigmoid": (0.2, 0.5, _hard_sigmoid),
    "elu": (1.0, None, _elu),
    "softsign": (None, None, lambda x: x / (1 + np.abs(x))),
    "softplus": (None, None, _softplus),
}


def _activations(spec: NodeSpec, defaults: Sequence[str], directions: int) -> list[Activation]:
    """The activation functions of the node, ``len(defaults)`` per direction, in order.

    ``activation_alpha`` / ``activation_beta`` are consumed in the order of the functions,
    each function taking values only for the parameters it has (the default otherwise).
    """
    names = [str(n) for n in spec.attr("activations", list(defaults) * directions)]
    if len(names) != len(defaults) * directions:
        raise ValueError(
            f"{spec.op_type}: expected {len(defaults) * directions} activations "
            f"({len(defaults)} per direction), got {names}"
        )
    alphas = [float(a) for a in spec.attr("activation_alpha", [])]
    betas = [float(b) for b in spec.attr("activation_beta", [])]
    functions = []
    for name in names:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise ValueError(f"{spec.op_type}: unknown activation {name!r}")
        alpha, beta, fn = entry
        params = []
        if alpha is not None:
            params.append(alphas.pop(0) if alphas else alpha)
        if beta is not None:
            params.append(betas.pop(0) if betas else beta)
        functions.append(_bind(fn, params))
    return functions


def _bind(fn: Callable[..., np.ndarray], params: list[float]) -> Activation:
    if not params:
        return fn
    return lambda x: fn(x, *params)


@dataclass(frozen=True)
class _Attrs:
    """The attributes common to the three operators, parsed once at compile time."""

    directions: int
    reverse_first: bool
    """The only direction is ``reverse``."""
    hidden_size: int | None
    clip: float | None
    layout: int
    activations: list[Activation]


def _common_attrs(spec: NodeSpec, defaults: Sequence[str]) -> _Attrs:
    direction = str(spec.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(
            f"{spec.op_type}: direction must be forward, reverse or bidirectional, "
            f"got {direction!r}"
        )
    directions = 2 if direction == "bidirectional" else 1
    layout = int(spec.attr("layout", 0))
    if layout not in (0, 1):
        raise ValueError(f"{spec.op_type}: layout must be 0 or 1, got {layout}")
    clip = spec.attr("clip")
    hidden = spec.attr("hidden_size")
    return _Attrs(
        directions=directions,
        reverse_first=direction == "reverse",
        hidden_size=None if hidden is None else int(hidden),
        clip=None if clip is None else float(clip),
        layout=layout,
        activations=_activations(spec, defaults, directions),
    )


def _clipped(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip, out=x)


def _reverse_index(lengths: np.ndarray | None, seq: int, batch: int) -> tuple[np.ndarray, ...]:
    """Indices that reverse each sequence within its own length (rows past it stay)."""
    t = np.arange(seq)[:, None]
    if lengths is None:
        rows = np.broadcast_to(seq - 1 - t, (seq, batch))
    else:
        rows = np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    return rows, np.broadcast_to(np.arange(batch)[None, :], (seq, batch))


def _scan(step: Step, xw: np.ndarray, state: State, lengths: np.ndarray | None) -> State:
    """Run ``step`` over the time axis of ``xw``; return (Y, final state...).

    Where ``lengths`` is given, batch entries past their length keep their state and get
    zero output rows.
    """
    seq = xw.shape[0]
    h = state[0]
    y = np.empty((seq, *h.shape), h.dtype)
    token = current_cancel_token()
    for t in range(seq):
        if not t % CANCEL_EVERY:
            stop_if_cancelled(token)
        new = step(xw[t], state)
        if lengths is not None:
            alive = (t < lengths)[:, None]
            new = tuple(np.where(alive, n, s) for n, s in zip(new, state))
            y[t] = np.where(alive, new[0], 0)
        else:
            y[t] = new[0]
        state = new
    return (y, *state)


_STATE_NAMES = ("initial_h", "initial_c")


def _full_lengths(lengths: np.ndarray | None, seq: int, batch: int) -> bool:
    """Whether ``sequence_lens`` is absent or gives every sequence the full length."""
    return lengths is None or (lengths.shape == (batch,) and bool((lengths == seq).all()))


def _check_inputs(
    attrs: _Attrs,
    op_type: str,
    gates: int,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    lengths: np.ndarray | None,
    initial: Sequence[np.ndarray | None],
) -> tuple[int, int, int]:
    """Check every input's shape against the operator's specification; return
    (seq_length, batch_size, hidden_size).

    numpy would broadcast a state of batch 1 (or 0) against the batch, or a short bias
    against the gates, and return a wrong (or empty) result without a word: a shape the
    specification does not allow is an error naming the input, the expected and the
    actual shape.
    """
    state_text = (
        "[batch_size, num_directions, hidden_size]"
        if attrs.layout
        else "[num_directions, batch_size, hidden_size]"
    )
    if x.ndim != 3:
        x_text = (
            "[batch_size, seq_length, input_size]"
            if attrs.layout
            else "[seq_length, batch_size, input_size]"
        )
        raise ValueError(f"{op_type}: X must have rank 3 {x_text}, got shape {list(x.shape)}")
    gated = f"{gates}*hidden_size" if gates > 1 else "hidden_size"
    if r.ndim != 3:
        raise ValueError(
            f"{op_type}: R must have rank 3 [num_directions, {gated}, hidden_size], "
            f"got shape {list(r.shape)}"
        )
    seq, batch = (x.shape[1], x.shape[0]) if attrs.layout else x.shape[:2]
    dirs, hidden, size = attrs.directions, r.shape[-1], x.shape[2]
    if attrs.hidden_size is not None and attrs.hidden_size != hidden:
        raise ValueError(f"{op_type}: hidden_size is {attrs.hidden_size} but R gives {hidden}")
    state = (batch, dirs, hidden) if attrs.layout else (dirs, batch, hidden)
    gated_rows = gates * hidden
    if (
        w.shape == (dirs, gated_rows, size)
        and r.shape == (dirs, gated_rows, hidden)
        and (b is None or b.shape == (dirs, 2 * gated_rows))
        and (lengths is None or lengths.shape == (batch,))
        and all(s is None or s.shape == state for s in initial)
    ):
        return seq, batch, hidden  # every call checks: the messages wait for an error
    expected = (
        ("W", w, (dirs, gates * hidden, size)),
        ("R", r, (dirs, gates * hidden, hidden)),
        ("B", b, (dirs, 2 * gates * hidden)),
        ("sequence_lens", lengths, (batch,)),
        *((name, s, state) for name, s in zip(_STATE_NAMES, initial)),
    )
    for name, array, shape in expected:
        if array is not None and array.shape != shape:
            meaning = {
                "W": f"[num_directions, {gated}, input_size]",
                "R": f"[num_directions, {gated}, hidden_size]",
                "B": f"[num_directions, 2*{gated}]",
                "sequence_lens": "[batch_size]",
            }.get(name, state_text)
            _check_shape(op_type, name, array, shape, meaning)
    return seq, batch, hidden


def _check_shape(
    op_type: str, name: str, array: np.ndarray | None, shape: tuple[int, ...], meaning: str
) -> None:
    if array is not None and array.shape != shape:
        raise ValueError(
            f"{op_type}: {name} must have shape {list(shape)} {meaning}, got {list(array.shape)}"
        )


def _run_recurrent(
    attrs: _Attrs,
    op_type: str,
    gates: int,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    lengths: np.ndarray | None,
    initial: Sequence[np.ndarray | None],
    make_step: Callable[[int, np.ndarray, np.ndarray | None], Step],
) -> list[np.ndarray]:
    """The driver shared by the three operators: layouts, directions, lengths, outputs.

    ``make_step(direction, R[direction], recurrence bias or None)`` returns the cell; the
    input projection passed to it already holds the input bias (and the recurrence bias
    of the gates that add it directly, see ``direct_bias``). Returns Y then the final
    states, in the node's layout.
    """
    seq, batch, hidden = _check_inputs(attrs, op_type, gates, x, w, r, b, lengths, initial)
    out_dtype = x.dtype
    compute = np.float32 if out_dtype == np.float16 else out_dtype
    x, w, r = (a.astype(compute, copy=False) for a in (x, w, r))
    if attrs.layout == 1:
        x = x.swapaxes(0, 1)
        initial = [None if s is None else s.swapaxes(0, 1) for s in initial]
    if lengths is not None:
        lengths = lengths.astype(np.int64)
        if (lengths < 0).any() or (lengths > seq).any():
            raise ValueError(
                f"{op_type}: sequence_lens must hold {batch} lengths in [0, {seq}], "
                f"got {lengths.tolist()}"
            )
        if (lengths == seq).all():
            lengths = None
    # One product projects every time step of every direction.
    xw = np.matmul(x.reshape(-1, x.shape[-1]), w.reshape(-1, w.shape[-1]).T)
    xw = xw.reshape(seq, batch, attrs.directions, gates * hidden)
    bias = None if b is None else b.astype(compute, copy=False)
    ys, finals = [], []
    for d in range(attrs.directions):
        xd = xw[:, :, d]
        rb = None
        if bias is not None:
            xd = xd + bias[d, : gates * hidden]
            rb = bias[d, gates * hidden :]
        reverse = attrs.reverse_first or d == 1
        index = _reverse_index(lengths, seq, batch) if reverse else None
        if index is not None:
            xd = xd[index]
        state = tuple(
            np.zeros((batch, hidden), compute) if s is None else s[d].astype(compute)
            for s in initial
        )
        y, *final = _scan(make_step(d, r[d], rb), xd, state, lengths)
        ys.append(y[index] if index is not None else y)
        finals.append(final)
    y_all = np.stack(ys, axis=1)
    states = [np.stack([f[i] for f in finals]) for i in range(len(initial))]
    if attrs.layout == 1:
        y_all = y_all.transpose(2, 0, 1, 3)
        states = [s.swapaxes(0, 1) for s in states]
    return [a.astype(out_dtype, copy=False) for a in (y_all, *states)]


# -- the operators ------------------------------------------------------------------------


@kernel("RNN", since=7)
def rnn(spec: NodeSpec) -> Kernel:
    """RNN-7/14/22: ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)``."""
    attrs = _common_attrs(spec, ["Tanh"])
    outputs = spec.num_outputs

    def run(
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        initial_h: np.ndarray | None = None,
    ) -> tuple[np.ndarray, ...]:
        def make_step(d: int, rd: np.ndarray, rb: np.ndarray | None) -> Step:
            f = attrs.activations[d]
            r_t = rd.T

            def step(xt: np.ndarray, state: State) -> State:
                pre = xt + state[0] @ r_t
                if rb is not None:
                    pre += rb
                return (f(_clipped(pre, attrs.clip)),)

            return step

        result = _run_recurrent(attrs, "RNN", 1, x, w, r, b, lengths, [initial_h], make_step)
        return tuple(result[:outputs])

    return run


@kernel("GRU", since=7)
def gru(spec: NodeSpec) -> Kernel:
    """GRU-7/14/22: update gate z, reset gate r, candidate h (gate order z, r, h in W, R,
    B); ``linear_before_reset`` applies the reset gate after the recurrence product."""
    attrs = _common_attrs(spec, ["Sigmoid", "Tanh"])
    linear_before_reset = bool(spec.attr("linear_before_reset", 0))
    outputs = spec.num_outputs
    names = [
        str(n).lower() for n in spec.attr("activations", ["Sigmoid", "Tanh"] * attrs.directions)
    ]
    fast = attrs.clip is None and names == ["sigmoid", "tanh"] * attrs.directions
    # Constant weights (the usual case) are prepared once, on the first run.
    consts = (spec.const(1), spec.const(2), spec.const(3))
    cache: dict[np.dtype, GruWeights] = {}

    def run_fast(
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None,
        initial_h: np.ndarray | None,
    ) -> tuple[np.ndarray, ...]:
        out_dtype = x.dtype
        compute = compute_dtype(out_dtype)
        if w is consts[0] and r is consts[1] and b is consts[2]:
            if compute not in cache:
                cache[compute] = gru_fast_weights(w, r, b, compute, linear_before_reset, True)
            weights = cache[compute]
        else:
            weights = gru_fast_weights(w, r, b, compute, linear_before_reset, False)
        if attrs.layout == 1:
            x = x.swapaxes(0, 1)
            initial_h = None if initial_h is None else initial_h.swapaxes(0, 1)
        reverse = [attrs.reverse_first or d == 1 for d in range(attrs.directions)]
        y, y_h = gru_fast(
            x.astype(compute, copy=False),
            weights,
            None if initial_h is None else initial_h.astype(compute, copy=False),
            reverse,
        )
        if attrs.layout == 1:
            y, y_h = y.transpose(2, 0, 1, 3), y_h.swapaxes(0, 1)
        return tuple(a.astype(out_dtype, copy=False) for a in (y, y_h))[:outputs]

    def run(
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        initial_h: np.ndarray | None = None,
    ) -> tuple[np.ndarray, ...]:
        hidden = r.shape[-1]
        if fast:
            seq, batch, _ = _check_inputs(attrs, "GRU", 3, x, w, r, b, lengths, [initial_h])
            if seq and batch and x.dtype.kind == "f" and _full_lengths(lengths, seq, batch):
                return run_fast(x, w, r, b, initial_h)

        def make_step(d: int, rd: np.ndarray, rb: np.ndarray | None) -> Step:
            f, g = attrs.activations[2 * d : 2 * d + 2]
            r_zr, r_h = rd[: 2 * hidden].T, rd[2 * hidden :].T
            rb_zr = None if rb is None else rb[: 2 * hidden]
            rb_h = None if rb is None else rb[2 * hidden :]

            def step(xt: np.ndarray, state: State) -> State:
                h = state[0]
                zr = xt[:, : 2 * hidden] + h @ r_zr
                if rb_zr is not None:
                    zr += rb_zr
                zr = f(_clipped(zr, attrs.clip))
                z, reset = zr[:, :hidden], zr[:, hidden:]
                recurrent = (h if linear_before_reset else reset * h) @ r_h
                if rb_h is not None:
                    recurrent += rb_h
                if linear_before_reset:
                    recurrent *= reset
                candidate = g(_clipped(xt[:, 2 * hidden :] + recurrent, attrs.clip))
                return ((1 - z) * candidate + z * h,)

            return step

        result = _run_recurrent(attrs, "GRU", 3, x, w, r, b, lengths, [initial_h], make_step)
        return tuple(result[:outputs])

    return run


_FAST_LSTM_ACTIVATIONS = ("sigmoid", "tanh", "tanh")


FastWeights = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None"]
"""W transposed (see :func:`~.gru_fast.project_steps`), R, the summed biases, and
(bidirectional, small hidden size) R of both directions as one block-diagonal matrix for
:func:`_lstm_both_directions`."""

BOTH_DIRECTIONS_MAX_HIDDEN = 64
"""Up to this hidden size a bidirectional LSTM runs both directions in one loop over
time (half the numpy calls: each step's cost is mostly their fixed cost), at the price of
a product twice as large (the block-diagonal R): openWakeWord's hey-mycroft (hidden 64
and 32, 16 steps) 138 + 112 -> 122 + 77 us. Past it the product dominates."""

DIRECTIONS_ON_THREADS_WORK = 1 << 20
"""From this many multiply-adds in a step's recurrence product (4 * hidden * hidden *
batch), the two directions of a bidirectional LSTM run at the same time, each on one of
two intra-op threads, bit for bit as on one: ddddocr's recognizer (hidden 512, batch 1)
reads 4 MB of R per step and direction, about 90 us, in a product that releases the
GIL. Below, each step is a few microseconds of numpy calls that hold the GIL, and the
two threads would mostly wait for each other."""


def lstm_fast_weights(
    w: np.ndarray, r: np.ndarray, b: np.ndarray | None, compute: np.dtype, reused: bool
) -> FastWeights:
    """W (transposed), R and the summed biases of every direction for :func:`_lstm_fast`:
    gate rows in the order o, i, f, c (from ONNX's i, o, f, c), the rows of the three
    sigmoid gates halved, since ``sigmoid(z) = (1 + tanh(z / 2)) / 2`` lets one tanh call
    serve all four gates (halving is exact in binary floating point). For two directions
    with a hidden size up to :data:`BOTH_DIRECTIONS_MAX_HIDDEN`, also R of both as one
    block-diagonal matrix, its rows gate-major (o of both directions, then i, f and c),
    its columns the hidden states of both directions.

    ``reused``: the weights serve many runs (constants), so W is transposed into a
    contiguous matrix and each direction's R into Fortran order, as OpenBLAS multiplies
    them fastest (:func:`~.gru_fast.project_steps`; R by the hidden state 5-35% faster,
    hidden 32 to 256, batch 1 and 4). Weights fed as inputs, prepared on every run, stay
    views: the two transposing copies (ddddocr's 8 MB W) cost more than one run saves."""
    hidden = r.shape[-1]
    order = np.r_[hidden : 2 * hidden, 0:hidden, 2 * hidden : 4 * hidden]
    scale = np.ones(4 * hidden, compute)
    scale[: 3 * hidden] = 0.5
    w_fast = w.astype(compute)[:, order] * scale[:, None]
    r_fast = np.ascontiguousarray(r.astype(compute)[:, order] * scale[:, None])
    if b is None:
        bias = np.zeros((w.shape[0], 4 * hidden), compute)
    else:
        wide = b.astype(compute)
        bias = (wide[:, : 4 * hidden] + wide[:, 4 * hidden :])[:, order] * scale
    r_both = None
    if r.shape[0] == 2 and hidden <= BOTH_DIRECTIONS_MAX_HIDDEN:
        r_both = np.zeros((4, 2, hidden, 2, hidden), compute)
        for d in range(2):
            r_both[:, d, :, d, :] = r_fast[d].reshape(4, hidden, hidden)
        r_both = np.asfortranarray(r_both.reshape(8 * hidden, 2 * hidden))
    w_t = w_fast.reshape(-1, w.shape[-1]).T
    if reused:
        w_t = np.ascontiguousarray(w_t)
        r_fast = np.ascontiguousarray(r_fast.transpose(0, 2, 1)).transpose(0, 2, 1)
    return w_t, r_fast, bias, r_both


def _lstm_both_directions(
    xw: np.ndarray,
    r_both: np.ndarray,
    initial_h: np.ndarray | None,
    initial_c: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence of a bidirectional LSTM, both directions in one loop: at step
    ``t`` the forward direction reads time ``t``, the reverse one time ``seq - 1 - t``.

    ``xw`` is (direction, step, gate, batch) as :func:`_lstm_fast` makes it; returns the
    hidden states (direction, step, hidden, batch) in time order and the final cells
    (direction, hidden, batch). The buffers are those of :func:`_lstm_fast` with every
    gate block holding both directions (o0 o1 i0 i1 f0 f1 g0 g1, then c0 c1).
    """
    _, seq, gates, batch = xw.shape
    hidden = gates // 4
    width = 2 * hidden
    dtype = xw.dtype
    paired = np.empty((seq, 4, 2, hidden, batch), dtype)
    paired[:, :, 0] = xw[0].reshape(seq, 4, hidden, batch)
    paired[:, :, 1] = xw[1, ::-1].reshape(seq, 4, hidden, batch)
    paired_steps = paired.reshape(seq, 4 * width, batch)
    h = np.zeros((width, batch), dtype)
    cell = np.zeros((width, batch), dtype)
    for d in range(2):
        rows = slice(d * hidden, (d + 1) * hidden)
        if initial_h is not None:
            h[rows] = initial_h[d].T
        if initial_c is not None:
            cell[rows] = initial_c[d].T
    hs = np.empty((seq, width, batch), dtype)
    cell = lstm_loop(r_both, paired_steps, h, cell, hs, current_cancel_token())
    ys = np.empty((2, seq, hidden, batch), dtype)
    ys[0] = hs[:, :hidden]
    ys[1] = hs[::-1, hidden:]
    return ys, cell.reshape(2, hidden, batch)


def _lstm_fast(
    x: np.ndarray,
    weights: FastWeights,
    initial_h: np.ndarray | None,
    initial_c: np.ndarray | None,
    reverse: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The LSTM with default activations, no peepholes, clip or sequence lengths, in
    layout 0 and the compute dtype: (Y, Y_h, Y_c).

    Everything runs transposed, gate-major: the gates of a step are one (4H, batch)
    array (``R @ h``, R as stored), so each gate is a contiguous block and every
    elementwise call works on contiguous memory. The cell state sits right after the
    candidate gate in the same buffer, so ``[i, f] * [g, c]`` is one multiply.
    """
    w_t, r_all, bias, r_both = weights
    seq, batch, _ = x.shape
    dirs, gates, hidden = r_all.shape[0], r_all.shape[1], r_all.shape[2]
    dtype = w_t.dtype
    xw = project_steps(x, w_t, bias, gates)
    if r_both is not None and list(reverse) == [False, True]:
        ys, finals_c = _lstm_both_directions(xw, r_both, initial_h, initial_c)
        return _lstm_results(ys, finals_c, reverse)
    ys = np.empty((dirs, seq, hidden, batch), dtype)
    finals_c = np.empty((dirs, hidden, batch), dtype)

    token = current_cancel_token()  # of this thread: a direction may run on another

    def directions(first: int, last: int) -> None:
        for d in range(first, last):
            h0 = None if initial_h is None else initial_h[d].T
            c0 = None if initial_c is None else initial_c[d].T
            _lstm_direction(r_all[d], xw[d], h0, c0, reverse[d], ys[d], finals_c[d], token)

    # Each direction is one thread's whole loop, bit for bit as on one thread.
    work = gates * hidden * batch if dirs > 1 else 0
    if work >= DIRECTIONS_ON_THREADS_WORK:
        run_parallel(directions, dirs, work=work)
    else:
        directions(0, dirs)
    return _lstm_results(ys, finals_c, reverse)


def _lstm_direction(
    r: np.ndarray,
    xw: np.ndarray,
    initial_h: np.ndarray | None,
    initial_c: np.ndarray | None,
    reverse: bool,
    ys: np.ndarray,
    final_c: np.ndarray,
    token: CancelToken,
) -> None:
    """The recurrence of one direction of :func:`_lstm_fast`: ``xw`` (step, gate, batch)
    in, the hidden states (step, hidden, batch) into ``ys`` in time order and the last
    cell (hidden, batch) into ``final_c``; stops when ``token`` is cancelled."""
    if reverse:  # the steps backwards, each hidden state still at its time
        xw, ys = xw[::-1], ys[::-1]
    final_c[...] = lstm_loop(r, xw, initial_h, initial_c, ys, token)


def _lstm_results(
    ys: np.ndarray, finals_c: np.ndarray, reverse: Sequence[bool]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y, Y_h and Y_c from the hidden states (direction, step, hidden, batch) in time
    order and the final cells (direction, hidden, batch)."""
    dirs, seq, hidden, batch = ys.shape
    y = np.ascontiguousarray(ys.transpose(1, 0, 3, 2))
    y_h = np.empty((dirs, batch, hidden), ys.dtype)
    for d in range(dirs):
        y_h[d] = y[0 if reverse[d] else seq - 1, d]
    y_c = np.ascontiguousarray(finals_c.transpose(0, 2, 1))
    return y, y_h, y_c


@kernel("LSTM", since=7)
def lstm(spec: NodeSpec) -> Kernel:
    """LSTM-7/14/22: gates i, o, f, c in W, R, B; peepholes ``P`` (i, o, f);
    ``input_forget`` couples the forget gate to the input gate (f = 1 - i)."""
    attrs = _common_attrs(spec, ["Sigmoid", "Tanh", "Tanh"])
    input_forget = bool(spec.attr("input_forget", 0))
    outputs = spec.num_outputs
    # The default activations hold for every direction (a bidirectional node without
    # the attribute has the defaults twice).
    default_names = ["Sigmoid", "Tanh", "Tanh"] * attrs.directions
    names = [str(n).lower() for n in spec.attr("activations", default_names)]
    fast = (
        attrs.clip is None
        and not input_forget
        and names == list(_FAST_LSTM_ACTIVATIONS) * attrs.directions
    )
    # Constant weights (the usual case) are reordered once, on the first run.
    consts = (spec.const(1), spec.const(2), spec.const(3))
    cache: dict[np.dtype, FastWeights] = {}

    def fast_weights(
        w: np.ndarray, r: np.ndarray, b: np.ndarray | None, compute: np.dtype
    ) -> FastWeights:
        if w is consts[0] and r is consts[1] and b is consts[2]:
            if compute not in cache:
                cache[compute] = lstm_fast_weights(w, r, b, compute, reused=True)
            return cache[compute]
        return lstm_fast_weights(w, r, b, compute, reused=False)

    def run_fast(
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None,
        initial_h: np.ndarray | None,
        initial_c: np.ndarray | None,
    ) -> tuple[np.ndarray, ...]:
        out_dtype = x.dtype
        compute = compute_dtype(out_dtype)
        if attrs.layout == 1:
            x = x.swapaxes(0, 1)
            initial_h = None if initial_h is None else initial_h.swapaxes(0, 1)
            initial_c = None if initial_c is None else initial_c.swapaxes(0, 1)
        reverse = [attrs.reverse_first or d == 1 for d in range(attrs.directions)]
        y, y_h, y_c = _lstm_fast(
            x.astype(compute, copy=False),
            fast_weights(w, r, b, compute),
            None if initial_h is None else initial_h.astype(compute, copy=False),
            None if initial_c is None else initial_c.astype(compute, copy=False),
            reverse,
        )
        if attrs.layout == 1:
            y = y.transpose(2, 0, 1, 3)
            y_h, y_c = y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)
        result = [a.astype(out_dtype, copy=False) for a in (y, y_h, y_c)]
        return tuple(result[:outputs])

    def run(
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        initial_h: np.ndarray | None = None,
        initial_c: np.ndarray | None = None,
        p: np.ndarray | None = None,
    ) -> tuple[np.ndarray, ...]:
        hidden = r.shape[-1]
        shape = (attrs.directions, 3 * hidden)
        _check_shape("LSTM", "P", p, shape, "[num_directions, 3*hidden_size]")
        if fast and p is None:
            seq, batch, _ = _check_inputs(
                attrs, "LSTM", 4, x, w, r, b, lengths, [initial_h, initial_c]
            )
            if seq and batch and x.dtype.kind == "f" and _full_lengths(lengths, seq, batch):
                return run_fast(x, w, r, b, initial_h, initial_c)
        peepholes = (
            None if p is None else p.astype(np.float32 if x.dtype == np.float16 else x.dtype)
        )

        def make_step(d: int, rd: np.ndarray, rb: np.ndarray | None) -> Step:
            f, g, h_act = attrs.activations[3 * d : 3 * d + 3]
            r_t = rd.T
            p_i, p_o, p_f = (None, None, None)
            if peepholes is not None:
                p_i, p_o, p_f = np.split(peepholes[d], 3)

            def step(xt: np.ndarray, state: State) -> State:
                h, c = state
                gates = xt + h @ r_t
                if rb is not None:
                    gates += rb
                cand = g(_clipped(gates[:, 3 * hidden :], attrs.clip))
                if p_i is None:
                    # Without peepholes the three gates take one activation call.
                    iof = f(_clipped(gates[:, : 3 * hidden], attrs.clip))
                    i, o, fg = iof[:, :hidden], iof[:, hidden : 2 * hidden], iof[:, 2 * hidden :]
                    fg = 1 - i if input_forget else fg
                    c_new = fg * c + i * cand
                else:
                    i = f(_clipped(gates[:, :hidden] + p_i * c, attrs.clip))
                    if input_forget:
                        fg = 1 - i
                    else:
                        fg = f(_clipped(gates[:, 2 * hidden : 3 * hidden] + p_f * c, attrs.clip))
                    c_new = fg * c + i * cand
                    o = f(_clipped(gates[:, hidden : 2 * hidden] + p_o * c_new, attrs.clip))
                return (o * h_act(c_new), c_new)

            return step

        result = _run_recurrent(
            attrs, "LSTM", 4, x, w, r, b, lengths, [initial_h, initial_c], make_step
        )
        return tuple(result[:outputs])

    return run
