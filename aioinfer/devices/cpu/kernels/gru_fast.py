"""The common GRU cell in a lean loop: default activations (sigmoid, tanh), no clip, every
sequence at full length, layout 0, in the compute dtype.

The general path (:mod:`.recurrent`) allocates every intermediate of every step, about
twenty numpy calls a step; this one runs twelve on preallocated, contiguous, gate-major
buffers (the state is (hidden, batch): ``R @ h``, R in Fortran order). As in the LSTM's fast
path, the rows of the sigmoid gates (z, r) are halved once, so that
``sigmoid(a) = (1 + tanh(a / 2)) / 2`` (halving is exact in binary floating point), and
``H_t = (1 - z) h~ + z H_{t-1}`` is computed as ``h~ + z (H_{t-1} - h~)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from aioinfer.devices.cpu.kernels.matmul import gemm_2d
from aioinfer.devices.cpu.plan import CANCEL_EVERY, current_cancel_token, stop_if_cancelled
from aioinfer.plugin.sync_request import CancelToken

COPIES_PER_BATCH_MAX = 8
"""Up to this batch, :func:`project_steps` moves the batch axis last one batch entry at a
time (at batch 16 one copy of the whole is faster)."""

GruWeights = tuple[np.ndarray, list[tuple[np.ndarray, ...]], np.ndarray, np.ndarray]
"""W of every direction as one matrix, transposed (see :func:`project_steps`); per
direction the recurrence matrices the loop multiplies the hidden state by (R with
``linear_before_reset``, else its z and r rows and its candidate rows); the input-side
biases (direction, gate) and the recurrence bias of the candidate (direction, hidden)."""


def project_steps(x: np.ndarray, w_t: np.ndarray, bias: np.ndarray, gates: int) -> np.ndarray:
    """The input projections of every step of every direction of a recurrent layer, biases
    added, in (direction, step, gate, batch) order: one product ``x @ W.T`` for all steps
    (``x`` (seq, batch, input), ``w_t`` the directions' W stacked and transposed, in a
    contiguous (input, direction * gate) array, ``bias`` (direction, gate)), the biases
    added in place, then the batch moved last. The GRU's and the LSTM's fast loops start
    with it.

    OpenBLAS multiplies by a contiguous right operand 2.7x faster than by a transposed
    view (16 x 96 times 96 x 512: 8.7 against 23 us), hence ``w_t``, transposed once.

    The move is a view for a batch of one; else a copy per batch entry up to
    :data:`COPIES_PER_BATCH_MAX`: numpy's one transposing copy (or addition) runs an
    inner loop per (step, gate) over the few batch entries, 50 us for 50 steps of batch 4
    and 200 gates, four times the copies."""
    seq, batch, _ = x.shape
    dirs = bias.shape[0]
    dtype = w_t.dtype
    flat = x.reshape(seq * batch, -1)
    projected = gemm_2d(flat, w_t, np.empty((seq * batch, w_t.shape[1]), dtype))
    np.add(projected, bias.reshape(-1), out=projected)
    moved = projected.reshape(seq, batch, dirs, gates).transpose(2, 0, 3, 1)
    if batch == 1:
        return moved
    xw = np.empty((dirs, seq, gates, batch), dtype)
    if batch <= COPIES_PER_BATCH_MAX:
        for b in range(batch):
            xw[..., b] = moved[..., b]
    else:
        np.copyto(xw, moved)
    return xw


@functools.lru_cache(maxsize=64)
def halves(rows: int, batch: int, dtype: np.dtype) -> np.ndarray:
    """A read-only (rows, batch) array of 0.5 that every loop of that shape shares: the
    sigmoid gates' affine multiplies and adds it (an array operand beats the scalar; a
    fresh ``np.full`` cost 0.8 us a call)."""
    half = np.full((rows, batch), 0.5, dtype)
    half.flags.writeable = False
    return half


def gru_fast_weights(
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    compute: np.dtype,
    linear_before_reset: bool,
    reused: bool,
) -> GruWeights:
    """The weights of :func:`gru_fast`: the z and r rows of W, R and their biases halved;
    the biases added once to the projection (with ``linear_before_reset``, the
    candidate's recurrence bias stays apart: the reset gate multiplies it). W transposed
    into a contiguous matrix and the recurrence matrices in Fortran order when the
    weights are ``reused`` by many runs (see :func:`project_steps`; OpenBLAS multiplies
    such an R by the hidden state 5-35% faster); views otherwise: the copies cost more
    than one run saves."""
    dirs, gates, hidden = r.shape
    scale = np.ones(gates, compute)
    scale[: 2 * hidden] = 0.5
    w_fast = (w.astype(compute) * scale[:, None]).reshape(-1, w.shape[-1])
    w_t = np.ascontiguousarray(w_fast.T) if reused else w_fast.T
    r_fast = r.astype(compute) * scale[:, None]
    layout = np.asfortranarray if reused else np.ascontiguousarray
    bounds = [(0, gates)] if linear_before_reset else [(0, 2 * hidden), (2 * hidden, gates)]
    r_loop = [tuple(layout(r_fast[d, a:b]) for a, b in bounds) for d in range(dirs)]
    wide = np.zeros((dirs, 2 * gates), compute) if b is None else b.astype(compute)
    bias = wide[:, :gates] + wide[:, gates:]
    r_bias_h = np.ascontiguousarray(wide[:, gates + 2 * hidden :])
    if linear_before_reset:
        bias[:, 2 * hidden :] = wide[:, 2 * hidden : gates]
    return w_t, r_loop, bias * scale, r_bias_h


def gru_fast(
    x: np.ndarray,
    weights: GruWeights,
    initial_h: np.ndarray | None,
    reverse: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray]:
    """(Y, Y_h) of the GRU of :data:`GruWeights` over ``x`` (seq, batch, input)."""
    w_t, r_loop, bias, r_bias_h = weights
    seq, batch, _ = x.shape
    dirs, hidden = r_bias_h.shape
    dtype = w_t.dtype
    xw = project_steps(x, w_t, bias, 3 * hidden)
    ys = np.empty((dirs, seq, hidden, batch), dtype)
    token = current_cancel_token()
    for d in range(dirs):
        h0 = None if initial_h is None else initial_h[d].T
        _gru_direction(r_loop[d], r_bias_h[d][:, None], xw[d], h0, reverse[d], ys[d], token)
    y = np.ascontiguousarray(ys.transpose(1, 0, 3, 2))
    y_h = np.empty((dirs, batch, hidden), dtype)
    for d in range(dirs):
        y_h[d] = y[0 if reverse[d] else seq - 1, d]
    return y, y_h


def _gru_direction(
    r_loop: tuple[np.ndarray, ...],
    r_bias_h: np.ndarray,
    xw: np.ndarray,
    initial_h: np.ndarray | None,
    reverse: bool,
    ys: np.ndarray,
    token: CancelToken,
) -> None:
    """One direction: ``xw`` (step, gate, batch) in, the hidden states (step, hidden,
    batch) into ``ys`` in time order; ``r_loop``: R alone with ``linear_before_reset``,
    else its z and r rows and its candidate rows. Stops when ``token`` is cancelled."""
    linear_before_reset = len(r_loop) == 1
    first, last = r_loop[0], r_loop[-1]  # R twice, or its z and r rows and candidate rows
    seq, gates, batch = xw.shape
    hidden = gates // 3
    dtype = xw.dtype
    tanh, multiply, add, subtract, dot = np.tanh, np.multiply, np.add, np.subtract, np.dot
    half = halves(2 * hidden, batch, dtype)
    pre = np.empty((gates, batch), dtype)
    zr, z, reset, cand = (
        pre[: 2 * hidden],
        pre[:hidden],
        pre[hidden : 2 * hidden],
        pre[2 * hidden :],
    )
    gated = np.empty((hidden, batch), dtype)  # r * h, then z * (h - h~)
    h = np.zeros((hidden, batch), dtype) if initial_h is None else initial_h  # only read
    for t in range(seq - 1, -1, -1) if reverse else range(seq):
        if not t % CANCEL_EVERY:
            stop_if_cancelled(token)
        if linear_before_reset:
            dot(first, h, pre)
            add(zr, xw[t, : 2 * hidden], zr)
        else:
            dot(first, h, zr)
            add(zr, xw[t, : 2 * hidden], zr)
        tanh(zr, zr)
        multiply(zr, half, zr)  # z and r: (1 + tanh(a / 2)) / 2
        add(zr, half, zr)
        if linear_before_reset:
            add(cand, r_bias_h, cand)
            multiply(cand, reset, cand)
        else:
            multiply(reset, h, gated)
            dot(last, gated, cand)
        add(cand, xw[t, 2 * hidden :], cand)
        tanh(cand, cand)
        subtract(h, cand, gated)
        multiply(z, gated, gated)
        h = ys[t]
        add(cand, gated, h)
