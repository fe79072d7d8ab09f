"""Stacked LSTM layers (LSTM -> Squeeze -> LSTM, as exporters write a multi-layer LSTM)
fuse into one ``LSTMStack`` node, which the CPU device runs as a wavefront or, past its
bounds, layer after layer. Every result is checked against onnx.reference on the
unfused model (float32: rtol 1e-5, atol 1e-5; float64: rtol 1e-10, atol 1e-12; float16:
computed in float32, within 2e-3 of the float32 reference).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx.reference import ReferenceEvaluator

import aioinfer
from aioinfer.devices.cpu.kernels import lstm_stack
from tests.helpers import make_model, tensor_info

FEATURES = 5


def _stack(
    hiddens: list[int],
    *,
    batch: int | None = None,
    states: bool = False,
    finals: bool = False,
    bias: bool = True,
    dtype: Any = np.float32,
    first_direction: str = "forward",
    lower_y_output: bool = False,
    squeeze_axis: int = 1,
    seed: int = 0,
) -> onnx.ModelProto:
    """``len(hiddens)`` LSTM layers over ``X [seq, batch, FEATURES]``, a Squeeze of the
    direction axis between them; graph outputs ``Y`` of the last layer (and every
    ``Y_h``/``Y_c`` with ``finals``); initial states as graph inputs with ``states``."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: dict[str, np.ndarray] = {}
    inputs = [tensor_info("X", dtype, [None, batch, FEATURES])]
    outputs = []
    x, width = "X", FEATURES
    for k, hidden in enumerate(hiddens):
        dirs = 1
        weights[f"W{k}"] = (rng.standard_normal((dirs, 4 * hidden, width)) * 0.4).astype(dtype)
        weights[f"R{k}"] = (rng.standard_normal((dirs, 4 * hidden, hidden)) * 0.3).astype(dtype)
        names = [x, f"W{k}", f"R{k}", "", "", "", ""]
        if bias:
            weights[f"B{k}"] = (rng.standard_normal((dirs, 8 * hidden)) * 0.3).astype(dtype)
            names[3] = f"B{k}"
        if states:
            names[5:7] = [f"h{k}", f"c{k}"]
            inputs += [tensor_info(n, dtype, [dirs, batch, hidden]) for n in names[5:7]]
        outs = [f"Y{k}", f"Yh{k}", f"Yc{k}"] if finals else [f"Y{k}"]
        direction = first_direction if k == 0 else "forward"
        nodes.append(
            oh.make_node(
                "LSTM",
                names,
                outs,
                name=f"lstm{k}",
                hidden_size=hidden,
                direction=direction,
            )
        )
        if finals:
            outputs += [tensor_info(n, dtype, [dirs, batch, hidden]) for n in outs[1:]]
        if k < len(hiddens) - 1:
            weights[f"axis{k}"] = np.array([squeeze_axis], np.int64)
            nodes.append(oh.make_node("Squeeze", [f"Y{k}", f"axis{k}"], [f"x{k + 1}"]))
            if lower_y_output and k == 0:
                outputs.append(tensor_info(f"Y{k}", dtype, [None, dirs, batch, hidden]))
            x, width = f"x{k + 1}", hidden * dirs
    last = len(hiddens) - 1
    outputs.insert(0, tensor_info(f"Y{last}", dtype, [None, 1, batch, hiddens[-1]]))
    return make_model(nodes, inputs, outputs, weights, opsets={"": 14})


def _feeds(
    model: onnx.ModelProto, seq: int, batch: int, rng: np.random.Generator, dtype: Any
) -> dict[str, np.ndarray]:
    feeds = {"X": rng.standard_normal((seq, batch, FEATURES)).astype(dtype)}
    for value in model.graph.input[1:]:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal((dims[0], batch, dims[2])) * 0.5).astype(dtype)
    return feeds


def _compiled(model: onnx.ModelProto) -> aioinfer.InferRequest:
    core = aioinfer.Core()
    return core.compile_model(model, "CPU", {"PERF_COUNT": True}).create_infer_request()


def _ops(request: aioinfer.InferRequest) -> list[str]:
    return [e["op_type"] for e in request.get_profiling_info() if e["type"] == "node"]


def _matches_reference(
    model: onnx.ModelProto,
    *,
    batch: int,
    seqs: tuple[int, ...] = (7, 1, 4),
    dtype: Any = np.float32,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> aioinfer.InferRequest:
    """Runs of each length of ``seqs`` (fresh inputs, the same request) agree with
    onnx.reference on the model as written; returns the request."""
    rng = np.random.default_rng(1)
    request = _compiled(model)
    reference = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    for seq in seqs:
        feeds = _feeds(model, seq, batch, rng, dtype)
        got = request.infer_sync(feeds)
        ref_feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
        want = reference.run(None, ref_feeds if dtype == np.float16 else feeds)
        for name, expected in zip(names, want):
            np.testing.assert_allclose(
                np.asarray(got[name], np.float64), expected, rtol=rtol, atol=atol, err_msg=name
            )
    return request


class _Waves:
    """Counts the calls of the wavefront."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = lstm_stack.wave

        def counted(*args: Any) -> Any:
            self.calls += 1
            return original(*args)

        monkeypatch.setattr(lstm_stack, "wave", counted)


@pytest.mark.parametrize("hiddens", [[6, 6], [6, 9, 4], [3, 5, 7, 2]])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("states", [False, True])
def test_stacked_layers_fuse_and_the_wave_matches_reference(
    hiddens: list[int], batch: int, states: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    waves = _Waves(monkeypatch)
    model = _stack(hiddens, batch=batch, states=states, finals=True)
    request = _matches_reference(model, batch=batch)
    assert _ops(request).count("LSTMStack") == 1 and "LSTM" not in _ops(request)
    assert waves.calls == 3


@pytest.mark.parametrize("bias", [False, True])
def test_past_the_wave_bounds_the_layers_run_in_turn(
    bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    waves = _Waves(monkeypatch)
    monkeypatch.setattr(lstm_stack, "WAVE_MAX_BATCH", 2)
    model = _stack([6, 4, 5], states=True, finals=True, bias=bias)
    _matches_reference(model, batch=3)
    assert waves.calls == 0
    _matches_reference(model, batch=2, seqs=(3,))
    assert waves.calls == 1


def test_a_joint_matrix_past_its_bound_runs_the_layers_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waves = _Waves(monkeypatch)
    monkeypatch.setattr(lstm_stack, "WAVE_MAX_JOINT_BYTES", 4 * 4 * 12 * 12 - 1)
    _matches_reference(_stack([6, 6], finals=True), batch=2)
    assert waves.calls == 0
    monkeypatch.setattr(lstm_stack, "WAVE_MAX_JOINT_BYTES", 4 * 4 * 12 * 12)
    _matches_reference(_stack([6, 6], finals=True), batch=2)
    assert waves.calls == 3


def test_float64_and_float16_stacks_match_reference() -> None:
    _matches_reference(
        _stack([6, 5], dtype=np.float64, states=True, finals=True),
        batch=2,
        dtype=np.float64,
        rtol=1e-10,
        atol=1e-12,
    )
    _matches_reference(
        _stack([6, 5], dtype=np.float16, states=True, finals=True),
        batch=2,
        dtype=np.float16,
        rtol=0,
        atol=2e-3,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"first_direction": "reverse"},
        {"lower_y_output": True},
        {"squeeze_axis": 0},
    ],
    ids=["reverse-below", "lower-Y-is-an-output", "other-squeeze-axis"],
)
def test_what_does_not_match_the_pattern_stays_as_written(change: dict[str, Any]) -> None:
    batch = 1 if change.get("squeeze_axis") == 0 else 2
    model = _stack([6, 5], batch=batch, finals=True, **change)
    if change.get("squeeze_axis") == 0:  # seq of 1: the Squeeze of axis 0 is valid
        request = _matches_reference(model, batch=batch, seqs=(1,))
    else:
        request = _matches_reference(model, batch=batch)
    assert "LSTMStack" not in _ops(request) and _ops(request).count("LSTM") == 2


def test_a_bad_state_of_an_upper_layer_fails_naming_the_layer_and_keeps_the_request() -> None:
    model = _stack([6, 5], states=True, finals=True)
    request = _compiled(model)
    rng = np.random.default_rng(2)
    feeds = _feeds(model, 4, 2, rng, np.float32)
    bad = {**feeds, "h1": np.zeros((1, 3, 5), np.float32)}
    with pytest.raises(aioinfer.InferenceError, match=r"layer 2 of 2 \('lstm1'\).*initial_h"):
        request.infer_sync(bad)
    got = request.infer_sync(feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(got["Y1"], want[0], rtol=1e-5, atol=1e-5)


def _streaming_stack(hidden: int = 6, layers: int = 2) -> onnx.ModelProto:
    """A multi-layer LSTM as PyTorch exports ``nn.LSTM(num_layers=2)`` for streaming:
    ``h0``/``c0`` [layers, batch, hidden] sliced per layer, the layers' ``Y_h``/``Y_c``
    concatenated into ``hn``/``cn``."""
    rng = np.random.default_rng(3)
    nodes: list[onnx.NodeProto] = []
    weights: dict[str, np.ndarray] = {}
    x, width = "X", FEATURES
    for k in range(layers):
        weights[f"W{k}"] = (rng.standard_normal((1, 4 * hidden, width)) * 0.4).astype(np.float32)
        weights[f"R{k}"] = (rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32)
        weights[f"B{k}"] = (rng.standard_normal((1, 8 * hidden)) * 0.3).astype(np.float32)
        weights[f"at{k}"] = np.array([k], np.int64)
        weights[f"to{k}"] = np.array([k + 1], np.int64)
        for state in ("h", "c"):
            nodes.append(
                oh.make_node("Slice", [f"{state}0", f"at{k}", f"to{k}"], [f"{state}0_{k}"])
            )
        nodes.append(
            oh.make_node(
                "LSTM",
                [x, f"W{k}", f"R{k}", f"B{k}", "", f"h0_{k}", f"c0_{k}"],
                [f"Y{k}", f"hn{k}", f"cn{k}"],
                name=f"lstm{k}",
                hidden_size=hidden,
            )
        )
        weights[f"axis{k}"] = np.array([1], np.int64)
        nodes.append(oh.make_node("Squeeze", [f"Y{k}", f"axis{k}"], [f"y{k}"]))
        x, width = f"y{k}", hidden
    for state in ("h", "c"):
        parts = [f"{state}n{k}" for k in range(layers)]
        nodes.append(oh.make_node("Concat", parts, [f"{state}n"], axis=0))
    shape = [layers, "batch", hidden]
    return make_model(
        nodes,
        [
            tensor_info("X", np.float32, ["seq", "batch", FEATURES]),
            tensor_info("h0", np.float32, shape),
            tensor_info("c0", np.float32, shape),
        ],
        [
            tensor_info(x, np.float32, ["seq", "batch", hidden]),
            tensor_info("hn", np.float32, shape),
            tensor_info("cn", np.float32, shape),
        ],
        weights,
        opsets={"": 14},
    )


def test_a_streaming_stack_made_stateful_matches_the_whole_sequence() -> None:
    """The states of both layers as variables (``STATEFUL``): chunks of 3, 1 and 4 steps
    give the last layer's outputs and final states of the whole 8-step sequence."""
    model = _streaming_stack()
    compiled = aioinfer.Core().compile_model(
        model, "CPU", {"STATEFUL": {"h0": "hn", "c0": "cn"}, "PERF_COUNT": True}
    )
    request = compiled.create_infer_request()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 2, FEATURES)).astype(np.float32)
    zeros = np.zeros((2, 2, 6), np.float32)
    want = ReferenceEvaluator(model).run(None, {"X": x, "h0": zeros, "c0": zeros})
    got = [request.infer_sync({"X": x[a:b]})["y1"] for a, b in ((0, 3), (3, 4), (4, 8))]
    assert "LSTMStack" in _ops(request)
    np.testing.assert_allclose(np.concatenate(got), want[0], rtol=1e-5, atol=1e-5)
    states = {s.name: s.state for s in request.query_state()}
    np.testing.assert_allclose(states["h0"], want[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(states["c0"], want[2], rtol=1e-5, atol=1e-5)


def test_an_exported_stack_imports_and_runs_the_same() -> None:
    core = aioinfer.Core()
    model = _stack([6, 4], states=True, finals=True)
    blob = core.compile_model(model, "CPU").export_model()
    request = core.import_model(blob, "CPU", {"PERF_COUNT": True}).create_infer_request()
    feeds = _feeds(model, 5, 2, np.random.default_rng(5), np.float32)
    got = request.infer_sync(feeds)
    assert "LSTMStack" in _ops(request)
    for output, expected in zip(model.graph.output, ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_allclose(got[output.name], expected, rtol=1e-5, atol=1e-5)
