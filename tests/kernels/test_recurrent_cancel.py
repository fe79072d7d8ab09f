"""Cancelling an inference stops a recurrent layer inside its loop over time, on every
path (the lean LSTM loop, both directions in one loop, directions on two threads, the
general path, the lean GRU loop, a stack of LSTM layers as one wavefront), and the
request stays usable.

No absolute time: the control is the same inference run to its end in the same test. A
cancel sent a tenth of the way in must end the run before six tenths; without the checks
in the loops it runs to its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer
from tests.helpers import make_model, tensor_info

pytestmark = pytest.mark.anyio

FEATURES, HIDDEN, STEPS = 3, 4, 40_000


def _layer(op: str, x: str, y: str, k: int, width: int, hidden: int, **attrs: object) -> tuple:
    rng = np.random.default_rng(k)
    gates = 4 if op == "LSTM" else 3
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    weights = {
        f"W{k}": (rng.standard_normal((dirs, gates * hidden, width)) * 0.3).astype(np.float32),
        f"R{k}": (rng.standard_normal((dirs, gates * hidden, hidden)) * 0.1).astype(np.float32),
    }
    node = oh.make_node(op, [x, f"W{k}", f"R{k}"], [y], hidden_size=hidden, **attrs)
    return node, weights


def _model(op: str, layers: int = 1, hidden: int = HIDDEN, **attrs: object) -> onnx.ModelProto:
    nodes, weights, x, width = [], {}, "X", FEATURES
    for k in range(layers):
        node, w = _layer(op, x, f"Y{k}", k, width, hidden, **attrs)
        nodes.append(node)
        weights.update(w)
        if k < layers - 1:
            weights[f"axis{k}"] = np.array([1], np.int64)
            nodes.append(oh.make_node("Squeeze", [f"Y{k}", f"axis{k}"], [f"x{k + 1}"]))
            x, width = f"x{k + 1}", hidden
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    return make_model(
        nodes,
        [tensor_info("X", np.float32, [None, 1, FEATURES])],
        [tensor_info(f"Y{layers - 1}", np.float32, [None, dirs, 1, hidden])],
        weights,
        opsets={"": 14},
    )


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], int]] = {
    "lstm-lean": (lambda: _model("LSTM"), STEPS),
    "lstm-both-directions": (lambda: _model("LSTM", direction="bidirectional"), STEPS),
    # 4 x 512 gates by 512 units: a direction per intra-op thread (fewer, longer steps:
    # the input projection of all steps, before the loop, grows with them)
    "lstm-directions-on-threads": (
        lambda: _model("LSTM", hidden=512, direction="bidirectional"),
        STEPS // 20,
    ),
    "lstm-general": (lambda: _model("LSTM", clip=50.0), STEPS // 4),
    "gru-lean": (lambda: _model("GRU"), STEPS),
    "lstm-stack": (lambda: _model("LSTM", layers=2), STEPS),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_cancel_stops_a_long_sequence_inside_the_loop(case: str) -> None:
    build, steps = CASES[case]
    compiled = await aioinfer.Core().compile_model_async(build(), "CPU")
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    long = rng.standard_normal((steps, 1, FEATURES)).astype(np.float32)
    name = compiled.outputs[0].name
    await request.infer({"X": long})  # warm: the plan for this shape is made
    started = time.perf_counter()
    whole = (await request.infer({"X": long}))[name].copy()
    whole_time = time.perf_counter() - started

    request.start_async({"X": long})
    started = time.perf_counter()
    await anyio.sleep(whole_time / 10)
    request.cancel()
    with pytest.raises(aioinfer.InferCancelledError), anyio.fail_after(120):
        await request.wait()
    assert time.perf_counter() - started < 0.6 * whole_time

    again = await request.infer({"X": long})  # the request is reusable, same results
    np.testing.assert_array_equal(again[name], whole)
    await compiled.close()
