"""A stack of unidirectional LSTM layers as one wavefront (``ai.aioinfer::LSTMStack``).

Exporters write a multi-layer LSTM as one ``LSTM`` node per layer, each reading the
previous one's ``Y`` through a ``Squeeze`` of its direction axis
(:mod:`aioinfer.devices.cpu.passes.fuse_lstm_stack` finds them). Run one after the other, each
layer pays its ten numpy calls per time step, and on small layers those calls are the
whole cost: onnxruntime runs a step of a 50-unit layer in about a microsecond, a numpy
call alone costs half of one.

Step ``t`` of layer ``k`` needs only step ``t`` of layer ``k - 1`` and step ``t - 1`` of
its own, so wave ``s`` computes step ``s - k`` of every layer ``k`` at once: one product
of a joint matrix (each layer's ``R`` on the diagonal, the next layer's ``W`` below it)
by the hidden states of all layers, then the gates of all layers in the same calls
(:func:`.lstm_loop.lstm_loop`, its buffers holding every layer). A
stack of ``n`` layers over ``seq`` steps takes ``seq + n - 1`` waves instead of
``n * seq`` steps. Waves where a layer has not started yet reset its state afterwards;
waves past a layer's end compute values nobody reads.

The joint product multiplies zeros (above the diagonal) and does the upper layers'
input projections step by step instead of in one product over all steps: for large
layers that costs more than the calls it saves, and the layers run one after the other
(:data:`WAVE_MAX_JOINT_BYTES`, :data:`WAVE_MAX_BATCH`), as they also do for input the
wave does not take (other dtypes, empty sequences, shapes the LSTM kernel rejects with
its messages).

Inputs: ``X``, then ``W``, ``R``, ``B``, ``initial_h``, ``initial_c`` of each layer
(``B`` and the states optional). Outputs: ``Y`` of the last layer (seq, 1, batch,
hidden), then ``Y_h`` and ``Y_c`` of each layer. Attributes: ``hidden_sizes``, and
``layer_names`` (the LSTM nodes, for error messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aioinfer.devices.cpu import ops
from aioinfer.devices.cpu.kernels.conv import compute_dtype
from aioinfer.devices.cpu.kernels.gru_fast import project_steps
from aioinfer.devices.cpu.kernels.lstm_loop import lstm_loop
from aioinfer.devices.cpu.kernels.recurrent import lstm, lstm_fast_weights
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel
from aioinfer.devices.cpu.plan import current_cancel_token

LAYER_INPUTS = 5
"""W, R, B, initial_h, initial_c."""

WAVE_MAX_JOINT_BYTES = 384 << 10
WAVE_MAX_BATCH = 8
"""The largest joint matrix (bytes) and batch the wave runs with. The wave saves about
nine numpy calls per step of each upper layer; past these bounds its product (twice the
multiply-adds of the layers' own recurrences for two layers, its matrix outgrowing the
L2 cache) costs more. Measured against the layers one after the other (50 steps, float32,
2026-12-01, 2-core AMD EPYC, OpenBLAS on one thread): 2 layers of 50 units 0.75x the time
at batch 1, 0.83x at batch 4, 1.9x at batch 16; 64 units 0.82x (batch 1), 0.91x (4),
2.3x (16); 3 layers of 50, batch 4, 0.83x; 4 of 32, batch 8, 0.79x; 2 of 96 (a 576 KB
matrix) 1.08x; 2 of 128 (1 MB) 1.2x at batch 1."""


@dataclass(frozen=True)
class StackWeights:
    """The weights of :func:`wave`: the gate rows of every layer in the order o, i, f,
    c (ONNX's is i, o, f, c), the sigmoid gates' rows halved (one tanh serves all four
    gates, as :func:`.recurrent.lstm_fast_weights` prepares them), gate-major across layers."""

    first_w: np.ndarray
    """The first layer's W, transposed (input, 4 * hidden), contiguous."""
    first_bias: np.ndarray
    """The first layer's summed biases (1, 4 * hidden)."""
    joint: np.ndarray
    """(4 * width, width), Fortran order: row block (gate, layer k), column block layer
    j: R of k where j == k, W of k where j == k - 1, else zero."""
    biases: np.ndarray
    """(4, width): the summed biases of the upper layers (the first layer's are zero:
    its projection carries them)."""
    offsets: tuple[int, ...]
    """Where each layer's rows start within a gate block, and the width at the end."""


def stack_weights(
    ws: Sequence[np.ndarray],
    rs: Sequence[np.ndarray],
    bs: Sequence[np.ndarray | None],
    compute: np.dtype,
) -> StackWeights:
    """:class:`StackWeights` from each layer's W, R and B as the LSTM node takes them."""
    hiddens = [r.shape[-1] for r in rs]
    offsets = tuple(int(o) for o in np.cumsum([0, *hiddens]))
    width = offsets[-1]
    joint = np.zeros((4, width, width), compute)
    biases = np.zeros((4, width), compute)
    first_w = first_bias = np.empty(0, compute)
    for k, (w, r, b) in enumerate(zip(ws, rs, bs)):
        hidden = hiddens[k]
        w_t, r_fast, bias, _ = lstm_fast_weights(w, r, b, compute, reused=False)
        rows = slice(offsets[k], offsets[k + 1])
        joint[:, rows, rows] = r_fast[0].reshape(4, hidden, hidden)
        if k == 0:
            first_w = np.ascontiguousarray(w_t)
            first_bias = bias[0].reshape(1, -1)
        else:
            joint[:, rows, offsets[k - 1] : offsets[k]] = w_t.T.reshape(4, hidden, -1)
            biases[:, rows] = bias[0].reshape(4, hidden)
    return StackWeights(
        first_w, first_bias, np.asfortranarray(joint.reshape(4 * width, width)), biases, offsets
    )


def joint_bytes(hiddens: Sequence[int], itemsize: int) -> int:
    """The size of the joint matrix of layers of these hidden sizes."""
    width = sum(hiddens)
    return 4 * width * width * itemsize


def wave(
    x: np.ndarray,
    weights: StackWeights,
    initial_h: Sequence[np.ndarray | None],
    initial_c: Sequence[np.ndarray | None],
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The stack over ``x`` (seq, batch, input), seq and batch at least 1, in the compute
    dtype: ``Y`` of the last layer and ``Y_h``, ``Y_c`` of every layer, in order."""
    seq, batch, _ = x.shape
    offsets = weights.offsets
    layers, width = len(offsets) - 1, offsets[-1]
    first = offsets[1]
    dtype = weights.joint.dtype
    waves = seq + layers - 1
    xw = project_steps(x, weights.first_w, weights.first_bias, 4 * first)[0]
    added = np.empty((waves, 4, width, batch), dtype)
    added[...] = weights.biases[:, :, None]
    added[:seq, :, :first] = xw.reshape(seq, 4, first, batch)
    steps = added.reshape(waves, 4 * width, batch)

    start_h = np.zeros((width, batch), dtype)
    start_c = np.zeros((width, batch), dtype)
    for k in range(layers):
        rows = slice(offsets[k], offsets[k + 1])
        h_k, c_k = initial_h[k], initial_c[k]
        if h_k is not None:
            start_h[rows] = h_k[0].T
        if c_k is not None:
            start_c[rows] = c_k[0].T
    hs = np.empty((waves, width, batch), dtype)
    finals_c = np.empty((width, batch), dtype)
    last_wave = {seq - 1 + k: k for k in range(layers)}  # layer k's last step

    def after(s: int, h: np.ndarray, cell: np.ndarray) -> None:
        if s < layers - 1:  # the layers past s have not started: back to their start
            waiting = slice(offsets[s + 1], width)
            h[waiting] = start_h[waiting]
            cell[waiting] = start_c[waiting]
        if s in last_wave:
            rows = slice(offsets[last_wave[s]], offsets[last_wave[s] + 1])
            finals_c[rows] = cell[rows]

    hooked = {*range(layers - 1), *last_wave}
    lstm_loop(weights.joint, steps, start_h, start_c, hs, current_cancel_token(), after, hooked)
    last = slice(offsets[-2], width)
    y = np.ascontiguousarray(hs[layers - 1 :, last].transpose(0, 2, 1))[:, None]
    finals: list[np.ndarray] = []
    for k in range(layers):
        rows = slice(offsets[k], offsets[k + 1])
        finals.append(np.ascontiguousarray(hs[seq - 1 + k, rows].T)[None])
        finals.append(np.ascontiguousarray(finals_c[rows].T)[None])
    return y, finals


def _layer_spec(spec: NodeSpec, k: int, hidden: int, name: str) -> NodeSpec:
    """The NodeSpec of layer ``k`` (named ``name``) as the LSTM node it was."""
    first = 1 + LAYER_INPUTS * k
    return NodeSpec(
        op_type="LSTM",
        domain="",
        opset=14,
        name=name,
        attrs={"hidden_size": hidden},
        num_inputs=7,
        num_outputs=3,
        const_inputs=(None, spec.const(first), spec.const(first + 1), spec.const(first + 2)),
    )


def _layer_names(spec: NodeSpec) -> list[str]:
    hiddens = ops.HIDDEN_SIZES.read(spec)
    names = [str(n) for n in ops.LAYER_NAMES.read(spec)]
    return names if len(names) == len(hiddens) else [f"layer {k + 1}" for k in range(len(hiddens))]


@kernel(ops.LSTM_STACK.name, since=1, domain=ops.DOMAIN, execution_type="fused")
def lstm_stack(spec: NodeSpec) -> Kernel:
    """The LSTM layers of the node, as one wavefront when their weights are constant and
    the wave pays (see the module's docstring), else one after the other."""
    hiddens = [int(h) for h in ops.HIDDEN_SIZES.read(spec)]
    layers = len(hiddens)
    names = _layer_names(spec)
    runs = [lstm(_layer_spec(spec, k, hidden, names[k])) for k, hidden in enumerate(hiddens)]
    ws = [spec.const(1 + LAYER_INPUTS * k) for k in range(layers)]
    rs = [spec.const(2 + LAYER_INPUTS * k) for k in range(layers)]
    biased = [spec.const(3 + LAYER_INPUTS * k) for k in range(layers)]
    const_ws = [w for w in ws if w is not None]
    const_rs = [r for r in rs if r is not None]
    constant = len(const_ws) == len(const_rs) == layers
    cache: dict[np.dtype, StackWeights] = {}
    # Whether the joint matrix fits the wave's bound, by the item size it is made in.
    fits = {size: joint_bytes(hiddens, size) <= WAVE_MAX_JOINT_BYTES for size in (4, 8)}

    def one_after_another(
        x: np.ndarray, inputs: Sequence[np.ndarray | None]
    ) -> tuple[np.ndarray, ...]:
        finals: list[np.ndarray] = []
        y = x
        for k, run in enumerate(runs):
            w, r, b, h0, c0 = inputs[LAYER_INPUTS * k : LAYER_INPUTS * (k + 1)]
            try:
                y, y_h, y_c = run(x, w, r, b, None, h0, c0)
            except ValueError as exc:
                raise ValueError(f"LSTM layer {k + 1} of {layers} ({names[k]!r}): {exc}") from exc
            finals += [y_h, y_c]
            x = y[:, 0]
        return (y, *finals)

    def takes_wave(x: np.ndarray, inputs: Sequence[np.ndarray | None]) -> bool:
        if not constant or x.ndim != 3 or x.dtype.kind != "f" or 0 in x.shape[:2]:
            return False
        batch = x.shape[1]
        if x.shape[2] != const_ws[0].shape[-1]:
            return False
        for k, hidden in enumerate(hiddens):
            w, r, b, h0, c0 = inputs[LAYER_INPUTS * k : LAYER_INPUTS * (k + 1)]
            if w is not ws[k] or r is not rs[k] or b is not biased[k]:
                return False
            if any(s is not None and s.shape != (1, batch, hidden) for s in (h0, c0)):
                return False
        return batch <= WAVE_MAX_BATCH and fits[8 if x.dtype == np.float64 else 4]

    def run(x: np.ndarray, *inputs: np.ndarray | None) -> tuple[np.ndarray, ...]:
        inputs = inputs + (None,) * (LAYER_INPUTS * layers - len(inputs))
        if not takes_wave(x, inputs):
            return one_after_another(x, inputs)
        out_dtype = x.dtype
        compute = compute_dtype(out_dtype)
        if compute not in cache:
            cache[compute] = stack_weights(const_ws, const_rs, biased, compute)

        def state(i: int) -> list[np.ndarray | None]:
            values = [inputs[LAYER_INPUTS * k + i] for k in range(layers)]
            return [None if v is None else v.astype(compute, copy=False) for v in values]

        y, finals = wave(x.astype(compute, copy=False), cache[compute], state(3), state(4))
        return tuple(a.astype(out_dtype, copy=False) for a in (y, *finals))

    return run
