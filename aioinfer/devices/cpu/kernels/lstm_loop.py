"""The LSTM's lean loop over time: nine numpy calls a step on preallocated buffers.

One loop serves every fast LSTM path: one direction (:func:`.recurrent._lstm_direction`),
both directions of a small bidirectional layer at once, and a stack of layers as a
wavefront (:mod:`.lstm_stack`). They differ only in what the buffers hold: the gate
rows of one direction, of two, or of every layer, gate-major (all the o rows, then i,
f and c), the cell state after the candidate gate in the same buffer.

A step: ``R @ h`` into the gates, the step's input projection added, one ``tanh`` for
all four gates (the sigmoid gates' rows of R and of the projection are halved, so
``sigmoid(z) = (1 + tanh(z / 2)) / 2``), that affine in two calls over the three
sigmoid gates, ``[i, f] * [g, c]`` in one multiply, the cell's sum, its ``tanh``, and
the output gate's product written straight into the step's hidden state. Every call
takes its ``out`` positionally (keyword outs cost ~0.05 us more, np.matmul ~0.4 us
more than np.dot here). The inference's cancel token is looked at every
:data:`~aioinfer.devices.cpu.plan.CANCEL_EVERY` steps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from aioinfer.devices.cpu.kernels.gru_fast import halves
from aioinfer.devices.cpu.plan import CANCEL_EVERY, stop_if_cancelled
from aioinfer.plugin.sync_request import CancelToken

AfterStep = Callable[[int, np.ndarray, np.ndarray], object]
"""``after(step, h, cell)``: called after the steps it is given for, with the step's
hidden state and the cell (both writable: what it writes, the next step reads)."""


def _nothing(step: int, h: np.ndarray, cell: np.ndarray) -> None:
    """No work after a step."""


def lstm_loop(
    r: np.ndarray,
    steps: np.ndarray,
    initial_h: np.ndarray | None,
    initial_c: np.ndarray | None,
    hs: np.ndarray,
    token: CancelToken,
    after: AfterStep = _nothing,
    after_steps: Collection[int] = (),
) -> np.ndarray:
    """Run the cell over ``steps`` (step, 4 * width, batch), the input projections in
        the order of the loop; write each step's hidden state (width, batch) into ``hs[t]``
        (a reversed view runs a reverse direction in time order). ``r`` is (4 * width,
        width); the initial states (width, batch) default to zeros. Returns the last cell
    (a view of the loop's own buffer, which nothing else holds)."""
    count, gates, batch = steps.shape
    width = gates // 4
    dtype = steps.dtype
    state = np.empty((5 * width, batch), dtype)  # o, i, f, g (the gates), then c
    pre, sig = state[:gates], state[: 3 * width]
    i_f, g_c = state[width : 3 * width], state[3 * width :]
    out_gate, cell = state[:width], state[4 * width :]
    products = np.empty((2 * width, batch), dtype)
    first, second = products[:width], products[width:]
    cell_tanh = np.empty((width, batch), dtype)
    half = halves(3 * width, batch, dtype)
    h = np.zeros((width, batch), dtype) if initial_h is None else initial_h  # only read
    if initial_c is None:
        cell[...] = 0
    else:
        cell[...] = initial_c
    hooked = frozenset(after_steps)
    tanh, multiply, add, dot = np.tanh, np.multiply, np.add, np.dot
    for t in range(count):
        if not t % CANCEL_EVERY:
            stop_if_cancelled(token)
        dot(r, h, pre)
        add(pre, steps[t], pre)
        tanh(pre, pre)
        multiply(sig, half, sig)  # the sigmoid gates: (1 + tanh(z / 2)) / 2
        add(sig, half, sig)
        multiply(i_f, g_c, products)  # i * g and f * c
        add(first, second, cell)
        tanh(cell, cell_tanh)
        h = hs[t]
        multiply(out_gate, cell_tanh, h)
        if t in hooked:
            after(t, h, cell)
    return cell
