"""RNN, GRU and LSTM against onnx.reference and onnxruntime.

onnx.reference implements the default activations without clip, sequence_lens or
input_forget (but with layout 1); onnxruntime implements everything but layout 1. Each
case is checked against whichever implements it. float32: rtol 1e-5, atol 1e-6 (1e-5
relative for the unbounded activations); float64: rtol 1e-12; float16: computed in
float32 here, compared with the float32 reference within float16's rounding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime as ort
import pytest

import aioinfer
from aioinfer.devices.cpu.kernels import parallel, recurrent
from aioinfer.devices.cpu.kernels.gru_fast import COPIES_PER_BATCH_MAX
from aioinfer.devices.cpu.kernels.parallel import set_intra_op_threads
from aioinfer.devices.cpu.kernels.recurrent import (
    BOTH_DIRECTIONS_MAX_HIDDEN,
    DIRECTIONS_ON_THREADS_WORK,
)
from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.helpers import make_model, tensor_info
from tests.kernels._check import check_node, run_aioinfer, run_reference

INPUT_NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OUTPUTS = {"RNN": 2, "GRU": 2, "LSTM": 3}
OUTPUT_NAMES = ["Y", "Y_h", "Y_c"]
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def _inputs(
    op: str,
    directions: int = 1,
    *,
    seed: int = 0,
    bias: bool = True,
    lengths: Sequence[int] | None = None,
    initial: bool = False,
    peepholes: bool = False,
    layout: int = 0,
    dtype: type = np.float32,
) -> list[np.ndarray | None]:
    """X, W, R, B, sequence_lens, initial_h (, initial_c, P) for ``op``."""
    rng = np.random.default_rng(seed)
    gates = GATES[op]

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(dtype)

    x = normal(SEQ, BATCH, INPUT)
    state_shape = (directions, BATCH, HIDDEN)
    values: list[np.ndarray | None] = [
        x.swapaxes(0, 1).copy() if layout else x,
        normal(directions, gates * HIDDEN, INPUT, scale=0.5),
        normal(directions, gates * HIDDEN, HIDDEN, scale=0.5),
        normal(directions, 2 * gates * HIDDEN, scale=0.5) if bias else None,
        None if lengths is None else np.array(lengths, np.int32),
    ]
    states = 2 if op == "LSTM" else 1
    for _ in range(states):
        h = normal(*state_shape) if initial else None
        values.append(h.swapaxes(0, 1).copy() if (h is not None and layout) else h)
    if op == "LSTM":
        values.append(normal(directions, 3 * HIDDEN, scale=0.5) if peepholes else None)
    return values


def _node(
    op: str, inputs: Sequence[np.ndarray | None], outputs: int, **attrs: Any
) -> onnx.NodeProto:
    names = [n if x is not None else "" for n, x in zip(INPUT_NAMES, inputs)]
    while names and not names[-1]:
        names.pop()
    return oh.make_node(op, names, ["Y", "Y_h", "Y_c"][:outputs], hidden_size=HIDDEN, **attrs)


def _onnxruntime(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    feeds = {n: x for n, x in zip(node.input, inputs) if n and x is not None}
    x = inputs[0]
    assert x is not None
    model = make_model(
        [node],
        [tensor_info(n, a.dtype, a.shape) for n, a in feeds.items()],
        [tensor_info(n, x.dtype, [None] * (4 if n == "Y" else 3)) for n in node.output if n],
        opsets={"": 14},
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _check_onnxruntime(
    node: onnx.NodeProto,
    inputs: Sequence[np.ndarray | None],
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> list[np.ndarray]:
    got = run_aioinfer(node, inputs, 14)
    want = _onnxruntime(node, inputs)
    outputs = [i for i, name in enumerate(node.output) if name]
    assert len(want) == len(outputs)
    for i, w in zip(outputs, want):
        assert got[i].dtype == w.dtype and got[i].shape == w.shape, (i, got[i].shape, w.shape)
        np.testing.assert_allclose(got[i], w, rtol=rtol, atol=atol, err_msg=node.output[i])
    return got


# -- against onnx.reference ----------------------------------------------------------------


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts_match_reference(op: str, direction: str, layout: int) -> None:
    directions = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op, directions, initial=True, layout=layout, peepholes=True)
    node = _node(op, inputs, OUTPUTS[op], direction=direction, layout=layout)
    got = check_node(node, inputs, opset=14)
    y = got[0]
    expected_y = (BATCH, SEQ, directions, HIDDEN) if layout else (SEQ, directions, BATCH, HIDDEN)
    assert y.shape == expected_y


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_defaults_without_bias_or_initial_state_match_reference(op: str) -> None:
    inputs = _inputs(op, bias=False)
    check_node(_node(op, inputs, OUTPUTS[op]), inputs, opset=14)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_float64_matches_reference(op: str) -> None:
    inputs = _inputs(op, 2, initial=True, dtype=np.float64)
    check_node(
        _node(op, inputs, OUTPUTS[op], direction="bidirectional"),
        inputs,
        opset=14,
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_float16_is_computed_in_float32(op: str) -> None:
    inputs = _inputs(op, initial=True, dtype=np.float16)
    node = _node(op, inputs, OUTPUTS[op])
    got = run_aioinfer(node, inputs, 14)
    wide = [None if x is None or x.dtype == np.int32 else x.astype(np.float32) for x in inputs]
    want = run_aioinfer(node, wide, 14)
    for g, w in zip(got, want):
        assert g.dtype == np.float16
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=2e-3, atol=2e-3)


def test_gru_linear_before_reset_matches_reference() -> None:
    inputs = _inputs("GRU", 2, initial=True)
    node = _node("GRU", inputs, 2, direction="bidirectional", linear_before_reset=1)
    check_node(node, inputs, opset=14)


def test_older_opset_versions_run() -> None:
    inputs = _inputs("LSTM", initial=True)
    check_node(_node("LSTM", inputs, 3), inputs, opset=7)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize(("bias", "initial"), [(True, True), (False, False), (True, False)])
def test_lstm_without_peepholes_matches_reference(
    direction: str, layout: int, bias: bool, initial: bool
) -> None:
    """The common LSTM (default activations, no peepholes): the lean gate-major loop."""
    directions = 2 if direction == "bidirectional" else 1
    inputs = _inputs("LSTM", directions, bias=bias, initial=initial, layout=layout)
    node = _node("LSTM", inputs, 3, direction=direction, layout=layout)
    check_node(node, inputs, opset=14)
    check_node(node, inputs, opset=14)  # again: the weights prepared on the first run


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_full_sequence_lens_match_onnxruntime(direction: str) -> None:
    directions = 2 if direction == "bidirectional" else 1
    inputs = _inputs("LSTM", directions, lengths=[SEQ] * BATCH, initial=True)
    _check_onnxruntime(_node("LSTM", inputs, 3, direction=direction), inputs)


def test_lstm_weights_given_as_inputs_match_reference() -> None:
    """Weights that are not constants (fed each run) are prepared on every run."""
    inputs = _inputs("LSTM", 2, initial=True)
    node = _node("LSTM", inputs, 3, direction="bidirectional")
    feeds = {n: x for n, x in zip(node.input, inputs) if n and x is not None}
    model = make_model(
        [node],
        [tensor_info(n, a.dtype, a.shape) for n, a in feeds.items()],
        [tensor_info(n, np.float32, [None] * (4 if n == "Y" else 3)) for n in node.output],
        opsets={"": 14},
    )
    request = aioinfer.Core().compile_model(model, "CPU").create_infer_request()
    for scale in (1.0, 0.5):
        feeds["R"] = inputs[2] * np.float32(scale)
        want = _onnxruntime(node, [feeds.get(n) for n in INPUT_NAMES])
        got = request.infer_sync(dict(feeds)).to_tuple()
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- against onnxruntime (attributes onnx.reference does not implement) --------------------


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_match_onnxruntime(op: str, direction: str) -> None:
    directions = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op, directions, lengths=[5, 2, 3], initial=True, peepholes=True)
    got = _check_onnxruntime(_node(op, inputs, OUTPUTS[op], direction=direction), inputs)
    # Past its length a sequence's Y rows are zero.
    assert not got[0][2:, :, 1].any() and got[0][:2, :, 1].any()


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_clip_matches_onnxruntime(op: str) -> None:
    inputs = _inputs(op, 2, initial=True)
    _check_onnxruntime(_node(op, inputs, OUTPUTS[op], direction="bidirectional", clip=0.4), inputs)


@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm_input_forget_matches_onnxruntime(peepholes: bool) -> None:
    inputs = _inputs("LSTM", initial=True, peepholes=peepholes)
    _check_onnxruntime(_node("LSTM", inputs, 3, input_forget=1), inputs)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        (
            "LSTM",
            {
                "activations": ["HardSigmoid", "LeakyRelu", "ScaledTanh"],
                "activation_alpha": [0.3, 0.2, 1.5],
                "activation_beta": [0.4, 0.7],
            },
        ),
        (
            "LSTM",
            {
                "activations": ["Affine", "Elu", "Softsign"],
                "activation_alpha": [0.3, 0.2],
                "activation_beta": [0.4],
            },
        ),
        (
            "LSTM",
            {"activations": ["HardSigmoid", "Tanh", "Tanh"] * 2, "direction": "bidirectional"},
        ),
        (
            "GRU",
            {
                "activations": ["Sigmoid", "Softsign", "HardSigmoid", "Tanh"],
                "activation_alpha": [0.25],
                "direction": "bidirectional",
                "linear_before_reset": 1,
            },
        ),
        (
            "RNN",
            {
                "activations": ["ThresholdedRelu", "Sigmoid"],
                "activation_alpha": [0.2],
                "direction": "bidirectional",
            },
        ),
        ("RNN", {"activations": ["Relu"]}),
        ("RNN", {"activations": ["Softplus"]}),
    ],
)
def test_activations_match_onnxruntime(op: str, attrs: dict[str, Any]) -> None:
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    inputs = _inputs(op, directions, initial=True)
    _check_onnxruntime(_node(op, inputs, OUTPUTS[op], **attrs), inputs, rtol=1e-5, atol=1e-5)


def test_only_the_requested_outputs() -> None:
    inputs = _inputs("LSTM", initial=True)
    node = oh.make_node("LSTM", INPUT_NAMES[:3], ["", "Y_h"], hidden_size=HIDDEN)
    _check_onnxruntime(node, inputs[:3])
    assert len(run_aioinfer(node, inputs[:3], 14)) == 2


# -- chunks with state ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_chunks_fed_with_their_state_equal_the_whole_sequence(op: str) -> None:
    inputs = _inputs(op, initial=True, peepholes=True)
    node = _node(op, inputs, OUTPUTS[op])
    whole = run_aioinfer(node, inputs, 14)
    states = list(inputs[5:7] if op == "LSTM" else inputs[5:6])
    x = inputs[0]
    assert x is not None
    ys = []
    for chunk in (x[:2], x[2:3], x[3:]):
        outputs = run_aioinfer(node, [chunk, *inputs[1:5], *states, *inputs[7:]], 14)
        ys.append(outputs[0])
        states = outputs[1:]
    np.testing.assert_allclose(np.concatenate(ys), whole[0], rtol=1e-6, atol=1e-6)
    for got, want in zip(states, whole[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"direction": "sideways"}, "direction must be forward, reverse or bidirectional"),
        ({"activations": ["Sigmoid", "Tanh"]}, "expected 3 activations"),
        ({"activations": ["Sigmoid", "Tanh", "Swish"]}, "unknown activation 'Swish'"),
        ({"layout": 2}, "layout must be 0 or 1"),
    ],
)
def test_bad_attributes_fail_to_compile_naming_the_node(
    attrs: dict[str, Any], message: str
) -> None:
    inputs = _inputs("LSTM")
    node = oh.make_node("LSTM", ["X", "W", "R"], ["Y"], name="my_lstm", hidden_size=HIDDEN, **attrs)
    model = make_model(
        [node],
        [tensor_info(n, np.float32, a.shape) for n, a in zip("XWR", inputs[:3]) if a is not None],
        [tensor_info("Y", np.float32, [None] * 4)],
        opsets={"": 14},
    )
    with pytest.raises(aioinfer.CompileError, match=message) as info:
        aioinfer.Core().compile_model(model, "CPU")
    assert "my_lstm" in str(info.value)


def test_weights_for_the_wrong_number_of_directions_fail_clearly() -> None:
    inputs = _inputs("GRU", 1)
    node = _node("GRU", inputs, 2, direction="bidirectional")
    with pytest.raises(
        ValueError,
        match=r"W must have shape \[2, 18, 4\] \[num_directions, 3\*hidden_size, input_size\], "
        r"got \[1, 18, 4\]",
    ):
        run_aioinfer(node, inputs, 14)


def _resized(array: np.ndarray | None, axis: int, size: int) -> np.ndarray:
    """``array`` with ``size`` entries along ``axis`` (repeating or cutting the first ones)."""
    assert array is not None
    return np.take(array, np.arange(size) % array.shape[axis], axis=axis)


# Shapes numpy would broadcast (a state of batch 1 or 0, a bias of one direction), and
# shapes that would fail deep inside a product: each is refused before computing, naming
# the input, the shape the specification wants and the shape given.
SHAPE_MISMATCHES = [
    # (op, input index, axis, size, layout, expected message)
    ("LSTM", 5, 1, 1, 0, r"initial_h must have shape \[1, 3, 6\] \[num_directions, batch_size"),
    ("LSTM", 5, 1, 0, 0, r"initial_h must have shape \[1, 3, 6\].*got \[1, 0, 6\]"),
    ("LSTM", 6, 1, 1, 0, r"initial_c must have shape \[1, 3, 6\].*got \[1, 1, 6\]"),
    ("LSTM", 5, 0, 1, 1, r"initial_h must have shape \[3, 1, 6\] \[batch_size, num_directions"),
    ("GRU", 5, 1, 1, 0, r"initial_h must have shape \[1, 3, 6\].*got \[1, 1, 6\]"),
    ("RNN", 5, 2, 1, 0, r"initial_h must have shape \[1, 3, 6\].*got \[1, 3, 1\]"),
    ("LSTM", 3, 1, 24, 0, r"B must have shape \[1, 48\] \[num_directions, 2\*4\*hidden_size\]"),
    ("GRU", 2, 1, 9, 0, r"R must have shape \[1, 18, 6\].*got \[1, 9, 6\]"),
    ("RNN", 1, 2, 5, 0, r"W must have shape \[1, 6, 4\].*got \[1, 6, 5\]"),
    ("LSTM", 7, 1, 6, 0, r"P must have shape \[1, 18\] \[num_directions, 3\*hidden_size\]"),
    ("RNN", 4, 0, 2, 0, r"sequence_lens must have shape \[3\] \[batch_size\], got \[2\]"),
]


def _bidirectional_lstm(
    seed: int,
    hidden: int,
    batch: int,
    seq: int,
    features: int,
    scales: tuple[float, float, float],
) -> tuple[onnx.NodeProto, list[np.ndarray | None]]:
    """A bidirectional LSTM node and random inputs (W, R and B scaled by ``scales``, no
    sequence lengths, initial states given)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inputs: list[np.ndarray | None] = [
        normal(seq, batch, features),
        normal(2, 4 * hidden, features, scale=scales[0]),
        normal(2, 4 * hidden, hidden, scale=scales[1]),
        normal(2, 8 * hidden, scale=scales[2]),
        None,
        normal(2, batch, hidden),
        normal(2, batch, hidden),
    ]
    names = [n if x is not None else "" for n, x in zip(INPUT_NAMES, inputs)]
    node = oh.make_node(
        "LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=hidden, direction="bidirectional"
    )
    return node, inputs


@pytest.mark.parametrize(
    ("op", "index", "axis", "size", "layout", "message"),
    SHAPE_MISMATCHES,
    ids=[
        f"{c[0]}-{INPUT_NAMES[c[1]]}-axis{c[2]}-size{c[3]}-layout{c[4]}" for c in SHAPE_MISMATCHES
    ],
)
def test_inputs_that_disagree_with_the_specification_fail_clearly(
    op: str, index: int, axis: int, size: int, layout: int, message: str
) -> None:
    inputs = _inputs(op, initial=True, peepholes=True, lengths=[5, 4, 3], layout=layout)
    inputs[index] = _resized(inputs[index], axis, size)
    with pytest.raises(ValueError, match=message):
        run_aioinfer(_node(op, inputs, OUTPUTS[op], layout=layout), inputs, 14)


def test_a_state_of_the_wrong_batch_fails_in_a_compiled_model_naming_the_node() -> None:
    inputs = _inputs("LSTM", initial=True)
    node = _node("LSTM", inputs, 3)
    node.name = "the_lstm"
    names = [n for n in node.input if n]
    feeds = {n: a for n, a in zip(INPUT_NAMES, inputs) if n in names and a is not None}
    model = make_model(
        [node],
        [tensor_info(n, np.float32, [None] * a.ndim) for n, a in feeds.items()],
        [tensor_info(n, np.float32, [None] * (4 if n == "Y" else 3)) for n in node.output],
        opsets={"": 14},
    )
    request = aioinfer.Core().compile_model(model, "CPU").create_infer_request()
    # Batch 1 against a state of batch 0: numpy would broadcast to an empty result.
    x = feeds["X"][:, :1]
    empty = np.zeros((1, 0, HIDDEN), np.float32)
    with pytest.raises(aioinfer.InferenceError, match=r"'the_lstm'.*initial_h.*\[1, 0, 6\]"):
        request.infer_sync({**feeds, "X": x, "initial_h": empty, "initial_c": empty})
    # onnxruntime refuses it too.
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="initial_h must have"):
        session.run(None, {**feeds, "X": x, "initial_h": empty, "initial_c": empty})


def test_sequence_lens_out_of_range_fail_clearly() -> None:
    inputs = _inputs("RNN", lengths=[5, 6, 1])
    with pytest.raises(ValueError, match=r"sequence_lens must hold 3 lengths in \[0, 5\]"):
        run_aioinfer(_node("RNN", inputs, 2), inputs, 14)


def test_bidirectional_lstm_default_activations_run_as_written_out() -> None:
    """A bidirectional LSTM without ``activations`` has the defaults for both directions:
    it runs the same computation (bit for bit) as one that names them, and agrees with
    onnx.reference (float32: rtol 1e-5, atol 1e-6)."""
    inputs = _inputs("LSTM", 2, initial=True)
    names = [n if x is not None else "" for n, x in zip(INPUT_NAMES, inputs)]
    outputs = ["Y", "Y_h", "Y_c"]
    common: dict[str, Any] = {"hidden_size": HIDDEN, "direction": "bidirectional"}
    implicit = oh.make_node("LSTM", names, outputs, **common)
    named = oh.make_node(
        "LSTM",
        names,
        outputs,
        activations=["Sigmoid", "Tanh", "Tanh"] * 2,
        **common,
    )
    got = run_aioinfer(implicit, inputs, 18)
    for g, w in zip(got, run_aioinfer(named, inputs, 18)):
        np.testing.assert_array_equal(g, w)
    check_node(implicit, inputs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hidden", [BOTH_DIRECTIONS_MAX_HIDDEN, BOTH_DIRECTIONS_MAX_HIDDEN + 1])
def test_bidirectional_lstm_both_directions_in_one_loop_match_reference(hidden: int) -> None:
    """Up to BOTH_DIRECTIONS_MAX_HIDDEN the two directions share one loop (a
    block-diagonal R); past it they run one after the other. Both agree with
    onnx.reference, initial states included (float32: rtol 1e-5, atol 1e-5)."""
    node, inputs = _bidirectional_lstm(11, hidden, 2, 7, 5, (0.3, 0.3, 0.3))
    check_node(node, inputs, rtol=1e-5, atol=1e-5)


def test_bidirectional_lstm_directions_on_two_threads_match_one_thread() -> None:
    """A bidirectional LSTM whose step product has DIRECTIONS_ON_THREADS_WORK
    multiply-adds or more runs its two directions on two intra-op threads (seen in CPU
    time: another thread computes about as much as the calling one in some run), with
    results bit for bit those of one thread, and agrees with onnx.reference (float32:
    rtol 1e-5, atol 1e-5)."""
    hidden, batch, seq, features = 256, 4, 40, 16
    assert 4 * hidden * hidden * batch >= DIRECTIONS_ON_THREADS_WORK
    node, inputs = _bidirectional_lstm(12, hidden, batch, seq, features, (0.2, 0.1, 0.2))
    before = parallel._POOL.threads
    try:
        set_intra_op_threads(1)
        alone = run_aioinfer(node, inputs, 14)
        set_intra_op_threads(2)
        shares = []
        for _ in range(10):
            own, total = time.thread_time(), time.process_time()
            split = run_aioinfer(node, inputs, 14)
            own, total = time.thread_time() - own, time.process_time() - total
            shares.append((total - own) / own)
    finally:
        set_intra_op_threads(before)
    for a, b in zip(alone, split):
        np.testing.assert_array_equal(a, b)
    assert max(shares) > 0.3, shares
    check_node(node, inputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
@pytest.mark.parametrize("batch", [1, 3, COPIES_PER_BATCH_MAX + 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lean_loops_over_every_batch_size_match_reference(
    op: str, batch: int, direction: str
) -> None:
    """The lean loops' input projection moves the batch axis last in three ways: a view
    for a batch of one, a copy per batch entry up to COPIES_PER_BATCH_MAX, one copy
    beyond. Each agrees with onnx.reference, initial states included (float32: rtol 1e-5,
    atol 1e-5)."""
    rng = np.random.default_rng(15)
    directions = 2 if direction == "bidirectional" else 1
    gates, hidden, seq, features = GATES[op], 12, 6, 5

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inputs: list[np.ndarray | None] = [
        normal(seq, batch, features),
        normal(directions, gates * hidden, features, scale=0.4),
        normal(directions, gates * hidden, hidden, scale=0.3),
        normal(directions, 2 * gates * hidden, scale=0.3),
        None,
        normal(directions, batch, hidden),
    ]
    if op == "LSTM":
        inputs.append(normal(directions, batch, hidden))
    names = [n if x is not None else "" for n, x in zip(INPUT_NAMES, inputs)]
    outputs = ["Y", "Y_h", "Y_c"][: OUTPUTS[op]]
    node = oh.make_node(op, names, outputs, hidden_size=hidden, direction=direction)
    check_node(node, inputs, opset=14, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_with_constant_weights_in_a_compiled_model_matches_reference(
    linear_before_reset: int,
) -> None:
    """The common GRU cell (default activations, no clip, full lengths) takes the lean
    loop, its weights prepared once from the model's constants: a bidirectional GRU with
    an initial state agrees with onnx.reference on two runs with different inputs
    (float32: rtol 1e-5, atol 1e-5)."""
    rng = np.random.default_rng(13)
    hidden, features = 16, 5
    weights = {
        "W": (rng.standard_normal((2, 3 * hidden, features)) * 0.4).astype(np.float32),
        "R": (rng.standard_normal((2, 3 * hidden, hidden)) * 0.3).astype(np.float32),
        "B": (rng.standard_normal((2, 6 * hidden)) * 0.3).astype(np.float32),
    }
    node = oh.make_node(
        "GRU",
        ["X", "W", "R", "B", "", "initial_h"],
        ["Y", "Y_h"],
        hidden_size=hidden,
        direction="bidirectional",
        linear_before_reset=linear_before_reset,
    )
    _compiled_matches_reference(node, weights, rng, batch=3, features=features, seqs=(7, 4))


@pytest.mark.parametrize("hidden", [BOTH_DIRECTIONS_MAX_HIDDEN, BOTH_DIRECTIONS_MAX_HIDDEN + 1])
@pytest.mark.parametrize("batch", [1, 3])
def test_lstm_with_constant_weights_in_a_compiled_model_matches_reference(
    hidden: int, batch: int
) -> None:
    """Constant weights are prepared once, laid out for BLAS (W transposed into a
    contiguous matrix, R in Fortran order, or the block-diagonal R of both directions up
    to BOTH_DIRECTIONS_MAX_HIDDEN): a bidirectional LSTM with initial states agrees with
    onnx.reference on two runs with different inputs (float32: rtol 1e-5, atol 1e-5)."""
    rng = np.random.default_rng(16)
    features = 5
    weights = {
        "W": (rng.standard_normal((2, 4 * hidden, features)) * 0.3).astype(np.float32),
        "R": (rng.standard_normal((2, 4 * hidden, hidden)) * 0.1).astype(np.float32),
        "B": (rng.standard_normal((2, 8 * hidden)) * 0.3).astype(np.float32),
    }
    node = oh.make_node(
        "LSTM",
        ["X", "W", "R", "B", "", "initial_h", "initial_c"],
        ["Y", "Y_h", "Y_c"],
        hidden_size=hidden,
        direction="bidirectional",
    )
    _compiled_matches_reference(node, weights, rng, batch=batch, features=features, seqs=(6, 3))


def _compiled_matches_reference(
    node: onnx.NodeProto,
    weights: dict[str, np.ndarray],
    rng: np.random.Generator,
    *,
    batch: int,
    features: int,
    seqs: tuple[int, ...],
) -> None:
    """A bidirectional GRU or LSTM ``node`` with constant ``weights`` (W, R, B) and initial
    states as inputs, compiled on the CPU device, agrees with onnx.reference on runs of
    each length of ``seqs`` with fresh inputs and states (float32: rtol 1e-5, atol 1e-5)."""
    states = [name for name in node.input if name.startswith("initial_")]
    outputs = list(node.output)
    hidden = weights["R"].shape[-1]
    model = make_model(
        [node],
        [
            tensor_info("X", np.float32, [None, batch, features]),
            *(tensor_info(name, np.float32, [2, batch, hidden]) for name in states),
        ],
        [tensor_info(name, np.float32, [None] * (4 if name == "Y" else 3)) for name in outputs],
        weights,
        opsets={"": 14},
    )
    request = aioinfer.Core().compile_model(model, "CPU").create_infer_request()
    for seq in seqs:
        x = rng.standard_normal((seq, batch, features)).astype(np.float32)
        initial = [rng.standard_normal((2, batch, hidden)).astype(np.float32) for _ in states]
        got = request.infer_sync({"X": x, **dict(zip(states, initial))})
        inputs = [x, weights["W"], weights["R"], weights["B"], None, *initial]
        want = run_reference(node, inputs, 14)
        for name, expected in zip(outputs, want):
            np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)


def test_gru_common_cell_takes_the_lean_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common GRU cell (default activations, no clip) runs the lean loop of
    :mod:`.gru_fast` (half the general loop's numpy calls per step: its speed is
    measured in benchmarks, not here); the same cell with a clip no value reaches takes
    the general loop; both give the same outputs (rtol 1e-5, atol 1e-6)."""
    rng = np.random.default_rng(14)
    hidden, batch, seq, features = 32, 4, 20, 16
    inputs = [
        rng.standard_normal((seq, batch, features)).astype(np.float32),
        (rng.standard_normal((1, 3 * hidden, features)) * 0.3).astype(np.float32),
        (rng.standard_normal((1, 3 * hidden, hidden)) * 0.2).astype(np.float32),
        (rng.standard_normal((1, 6 * hidden)) * 0.2).astype(np.float32),
    ]
    lean = oh.make_node("GRU", ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden)
    general = oh.make_node("GRU", ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden, clip=1e30)
    calls: list[int] = []
    original = recurrent.gru_fast

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(recurrent, "gru_fast", counted)
    results, taken = {}, {}
    for name, node in (("lean", lean), ("general", general)):
        run = find_kernel("", "GRU", 14, name).factory(make_spec(ir.from_proto(node), 14))
        calls.clear()
        results[name] = list(run(*inputs))
        taken[name] = len(calls)
    assert taken == {"lean": 1, "general": 0}
    for a, b in zip(results["lean"], results["general"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
