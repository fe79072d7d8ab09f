"""What real exported models do that small hand-made ones do not, each rebuilt in small.

- Dynamic dimensions spelled ``-1`` (a negative ``dim_value``) or ``"?"`` / ``""`` (a
  ``dim_param`` that names nothing): any size goes, as in onnxruntime, and two of them
  are not one dimension. Named dimensions (``"N"``) stay tied: the ONNX IR spec says a
  dimension variable has one value across the graph (onnxruntime does not check it).
- A state whose batch dimension is unnamed (``state [2, ?, 128]`` of a VAD, an LSTM's
  ``h0 [1, ?, 64]``): its initial value follows the batch of the recurrent node it
  reaches, or the first step is refused with an error that says how to give it.
- The ``STATEFUL: auto`` names of speech models (``state``/``stateN``, ``h``/``hn``).

Numbers are compared with onnxruntime (float32, rtol 1e-5, atol 1e-6); stateful runs
with onnxruntime fed the state by hand, step by step.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import httpx
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

import aioinfer as ai
from aioinfer.serving import create_app
from tests.helpers import Dims, make_model, reference_outputs, tensor_info
from tests.serving.conftest import LiveServer

RTOL, ATOL = 1e-5, 1e-6
HIDDEN, FRAME, FEATURES = 8, 16, 12


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# -- dynamic dimensions: -1, "?", "" ------------------------------------------------------------


def recognizer(dims: Dims) -> onnx.ModelProto:
    """An OCR recognizer's front: ``y = relu(conv3x3(x))``, x ``[N, 3, H, W]`` declared
    with ``dims``."""
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = None if dims is None else [dims[0], 4, *dims[2:]]
    return make_model(
        [
            oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            oh.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        [tensor_info("x", np.float32, dims)],
        [tensor_info("y", np.float32, out)],
        {"w": weight},
    )


@pytest.mark.parametrize(
    "dims",
    [[-1, 3, "?", "?"], ["?", 3, -1, ""], [None, 3, "*", "-1"]],
    ids=["paddle", "mixed", "other-placeholders"],
)
def test_negative_and_placeholder_dimensions_take_any_size(
    core: ai.Core, dims: list[int | str | None]
) -> None:
    model = recognizer(dims)
    read = core.read_model(model)
    assert read.input("x").shape == (None, 3, None, None)
    assert str(read.input("x")) == "x: float[?, 3, ?, ?]"
    assert read.output("y").shape == (None, 4, None, None)
    request = core.compile_model(read, "CPU").create_infer_request()
    for shape in [(6, 3, 48, 192), (1, 3, 32, 100)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        (want,) = reference_outputs(model, {"x": x})
        got = request.infer_sync({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5)


def concat_model(a: Dims, b: Dims) -> onnx.ModelProto:
    return make_model(
        [oh.make_node("Concat", ["a", "b"], ["y"], axis=0)],
        [tensor_info("a", np.float32, a), tensor_info("b", np.float32, b)],
        [tensor_info("y", np.float32, [None, 3])],
    )


def test_placeholders_tie_no_dimensions_together_and_names_do(core: ai.Core) -> None:
    a, b = np.ones((2, 3), np.float32), np.zeros((4, 3), np.float32)
    for dims in (["?", 3], [-1, 3], ["", 3]):
        model = concat_model(dims, dims)
        got = core.compile_model(model, "CPU").create_infer_request().infer_sync([a, b])
        np.testing.assert_array_equal(got["y"], reference_outputs(model, {"a": a, "b": b})[0])
    # Within one input too: ["?", "?"] is any matrix, not a square one.
    square = make_model(
        [oh.make_node("Relu", ["a"], ["y"])],
        [tensor_info("a", np.float32, ["?", "?"])],
        [tensor_info("y", np.float32, ["?", "?"])],
    )
    request = core.compile_model(square, "CPU").create_infer_request()
    assert request.infer_sync([a])["y"].shape == (2, 3)
    # A name is one dimension (ONNX IR spec: a dimension variable has one value in the
    # graph). onnxruntime does not check it; aioinfer does, before computing.
    named = concat_model(["N", 3], ["N", 3])
    assert session(named).run(None, {"a": a, "b": b})[0].shape == (6, 3)
    request = core.compile_model(named, "CPU").create_infer_request()
    with pytest.raises(ai.InputShapeError, match="'N'"):
        request.infer_sync([a, b])


def test_an_exported_minus_one_in_value_info_is_not_taken_for_a_size(core: ai.Core) -> None:
    # Shape/Size of a value declared [-1, 4] were folded to constants -4 and [-1, 4].
    graph = oh.make_graph(
        [
            oh.make_node("Relu", ["x"], ["t"]),
            oh.make_node("Size", ["t"], ["count"]),
            oh.make_node("Shape", ["t"], ["shape"]),
        ],
        "sizes",
        [tensor_info("x", np.float32, ["n", 4])],
        [tensor_info("count", np.int64, []), tensor_info("shape", np.int64, [2])],
        value_info=[tensor_info("t", np.float32, [-1, 4])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    x = np.ones((3, 4), np.float32)
    got = core.compile_model(model, "CPU").create_infer_request().infer_sync([x])
    want = reference_outputs(model, {"x": x})
    np.testing.assert_array_equal(got["count"], want[0])
    np.testing.assert_array_equal(got["shape"], want[1])


def test_the_server_reports_minus_one_and_serves_any_size(tmp_path) -> None:
    model = recognizer([-1, 3, "?", "?"])
    onnx.save(model, tmp_path / "recognizer.onnx")
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 20)).astype(np.float32)
    body = {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    app = create_app(tmp_path / "recognizer.onnx")
    with LiveServer(app) as live, httpx.Client(base_url=f"http://{live.url}", timeout=60) as client:
        metadata = client.get("/v2/models/recognizer").json()
        reply = client.post("/v2/models/recognizer/infer", json=body)
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4, -1, -1]}]
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    (want,) = reference_outputs(model, {"x": x})
    assert output["shape"] == list(want.shape)
    np.testing.assert_allclose(
        np.array(output["data"], np.float32).reshape(want.shape), want, rtol=RTOL, atol=1e-5
    )


# -- stateful speech models -------------------------------------------------------------------


def vad_model(batch: int | str | None, state_batch: int | str | None) -> onnx.ModelProto:
    """A VAD shaped like silero's: ``input [batch, 16]`` -> encoder -> one LSTM step whose
    ``h``/``c`` are the two halves of ``state [2, batch, 8]`` -> ``output [batch, 1]``
    (a probability) and ``stateN`` (``Concat(Y_h, Y_c)``)."""
    rng = np.random.default_rng(5)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.4).astype(np.float32)

    weights = {
        "W_enc": normal(FRAME, FEATURES),
        "W": normal(1, 4 * HIDDEN, FEATURES),
        "R": normal(1, 4 * HIDDEN, HIDDEN),
        "B": normal(1, 8 * HIDDEN),
        "W_out": normal(HIDDEN, 1),
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "axis0": np.array([0], np.int64),
    }
    nodes = [
        oh.make_node("MatMul", ["input", "W_enc"], ["encoded"]),
        oh.make_node("Relu", ["encoded"], ["features"]),
        oh.make_node("Unsqueeze", ["features", "axis0"], ["X"]),
        oh.make_node("Gather", ["state", "zero"], ["h2"], axis=0),
        oh.make_node("Gather", ["state", "one"], ["c2"], axis=0),
        oh.make_node("Unsqueeze", ["h2", "axis0"], ["h"]),
        oh.make_node("Unsqueeze", ["c2", "axis0"], ["c"]),
        oh.make_node(
            "LSTM",
            ["X", "W", "R", "B", "", "h", "c"],
            ["Y", "Y_h", "Y_c"],
            hidden_size=HIDDEN,
            name="decoder_lstm",
        ),
        oh.make_node("Concat", ["Y_h", "Y_c"], ["stateN"], axis=0),
        oh.make_node("Squeeze", ["Y_h", "axis0"], ["last"]),
        oh.make_node("MatMul", ["last", "W_out"], ["logit"]),
        oh.make_node("Sigmoid", ["logit"], ["output"]),
    ]
    state = [2, state_batch, HIDDEN]
    return make_model(
        nodes,
        [tensor_info("input", np.float32, [batch, FRAME]), tensor_info("state", np.float32, state)],
        [tensor_info("output", np.float32, [batch, 1]), tensor_info("stateN", np.float32, state)],
        weights,
        name="vad",
    )


def branched_on_sample_rate(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as silero VAD v5 is laid out: the whole network in both branches of an
    ``If`` on an extra input ``sr`` (int64 scalar; 16000 takes the first branch), the
    branches reading the main graph's initializers."""
    graph = model.graph

    def branch(suffix: str) -> onnx.GraphProto:
        nodes = []
        for node in graph.node:
            node = copy.deepcopy(node)
            node.output[:] = [
                f"{o}_{suffix}" if o in ("output", "stateN") else o for o in node.output
            ]
            nodes.append(node)
        outputs = [tensor_info(f"{o}_{suffix}", np.float32, None) for o in ("output", "stateN")]
        return oh.make_graph(nodes, f"rate_{suffix}", [], outputs)

    nodes = [
        oh.make_node("Equal", ["sr", "rate_16k"], ["is_16k"]),
        oh.make_node(
            "If", ["is_16k"], ["output", "stateN"], then_branch=branch("a"), else_branch=branch("b")
        ),
    ]
    initializers = {i.name: onh.to_array(i) for i in graph.initializer}
    initializers["rate_16k"] = np.array(16000, np.int64)
    return make_model(
        nodes,
        [*graph.input, tensor_info("sr", np.int64, [])],
        list(graph.output),
        initializers,
        name="vad_branched",
    )


def frames(batch: int, steps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((steps, batch, FRAME)).astype(np.float32)


def onnxruntime_steps(
    model: onnx.ModelProto,
    chunks: Sequence[dict[str, np.ndarray]],
    states: dict[str, str],
    batch: int,
) -> tuple[list[list[np.ndarray]], dict[str, np.ndarray]]:
    """Run ``chunks`` through onnxruntime step by step, feeding each state input
    (``states``: input -> output) the previous step's output; at the start zeros whose
    dynamic dimension is ``batch``. Returns every step's other outputs, and the last
    states."""
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    values = {
        info.name: np.zeros([d if isinstance(d, int) else batch for d in info.shape], np.float32)
        for info in sess.get_inputs()
        if info.name in states
    }
    steps = []
    for chunk in chunks:
        by_name = dict(zip(names, sess.run(None, {**chunk, **values})))
        values = {name: by_name[output] for name, output in states.items()}
        steps.append([by_name[n] for n in names if n not in states.values()])
    return steps, values


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("batch", "state_batch"),
    [(None, None), (-1, "?"), ("?", -1), ("batch", None)],
    ids=["unnamed", "paddle-style", "placeholder-input", "named-input"],
)
async def test_a_vad_with_an_unnamed_state_batch_streams_like_onnxruntime(
    core: ai.Core, batch: int | str | None, state_batch: int | str | None
) -> None:
    model = vad_model(batch, state_batch)
    compiled = core.compile_model(model, "CPU", {"STATEFUL": "auto"})
    assert compiled.get_property("STATEFUL") == {"state": "stateN"}
    request = compiled.create_infer_request()
    (state,) = request.query_state()
    for size, seed in ((1, 0), (3, 1)):
        request.reset_state()
        chunks = [{"input": x} for x in frames(size, 6, seed)]
        want, last = onnxruntime_steps(model, chunks, {"state": "stateN"}, size)
        for chunk, (want_output,) in zip(chunks, want):
            got = (await request.infer(chunk))["output"]
            assert got.shape == (size, 1)
            np.testing.assert_allclose(got, want_output, rtol=RTOL, atol=ATOL)
        assert state.state.shape == (2, size, HIDDEN)
        np.testing.assert_allclose(state.state, last["state"], rtol=RTOL, atol=ATOL)


@pytest.mark.anyio
async def test_a_vad_whose_network_sits_in_the_branches_of_an_if(core: ai.Core) -> None:
    model = branched_on_sample_rate(vad_model(None, "?"))
    compiled = core.compile_model(model, "CPU", {"STATEFUL": "auto"})
    assert compiled.get_property("STATEFUL") == {"state": "stateN"}
    request = compiled.create_infer_request()
    rate = np.array(16000, np.int64)
    chunks = [{"input": x, "sr": rate} for x in frames(3, 4, 9)]
    want, last = onnxruntime_steps(model, chunks, {"state": "stateN"}, 3)
    for chunk, (want_output,) in zip(chunks, want):
        got = (await request.infer(chunk))["output"]
        np.testing.assert_allclose(got, want_output, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(request.query_state()[0].state, last["state"], rtol=RTOL, atol=ATOL)


def test_the_initial_state_follows_the_batch_of_the_input_it_reaches(core: ai.Core) -> None:
    compiled = core.compile_model(vad_model(None, None), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    (state,) = request.query_state()
    assert state.state.shape == (2, 0, HIDDEN)  # no input set yet
    request.set_tensor("input", np.zeros((5, FRAME), np.float32))
    assert state.state.shape == (2, 5, HIDDEN) and not state.state.any()
    # A state of another batch is the user's to give, and the LSTM refuses a mismatch.
    state.state = np.zeros((2, 4, HIDDEN), np.float32)
    with pytest.raises(ai.InferenceError, match=r"'decoder_lstm'.*initial_h.*\[1, 5, 8\]"):
        request.infer_sync()
    assert state.state.shape == (2, 4, HIDDEN)


def test_export_and_import_keep_the_state_sizing(core: ai.Core) -> None:
    model = vad_model(None, "?")
    compiled = core.compile_model(model, "CPU", {"STATEFUL": "auto"})
    imported = core.import_model(compiled.export_model(), "CPU")
    request = imported.create_infer_request()
    chunks = [{"input": x} for x in frames(2, 3, 7)]
    want, _ = onnxruntime_steps(model, chunks, {"state": "stateN"}, 2)
    for chunk, (want_output,) in zip(chunks, want):
        got = request.infer_sync(chunk)["output"]
        np.testing.assert_allclose(got, want_output, rtol=RTOL, atol=ATOL)


def lstm_hc_model() -> onnx.ModelProto:
    """Older silero naming: ``X [seq, batch, 4]`` and ``h``/``c`` ``[1, ?, 8]`` straight
    into an LSTM's initial_h/initial_c; outputs ``Y``, ``hn``, ``cn``. Every dynamic
    dimension is unnamed."""
    rng = np.random.default_rng(11)
    weights = {
        "W": (rng.standard_normal((1, 4 * HIDDEN, 4)) * 0.5).astype(np.float32),
        "R": (rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.5).astype(np.float32),
    }
    node = oh.make_node("LSTM", ["X", "W", "R", "", "", "h", "c"], ["Y", "hn", "cn"], hidden_size=8)
    state = [1, None, HIDDEN]
    return make_model(
        [node],
        [
            tensor_info("X", np.float32, [None, None, 4]),
            tensor_info("h", np.float32, state),
            tensor_info("c", np.float32, state),
        ],
        [
            tensor_info("Y", np.float32, [None, 1, None, HIDDEN]),
            tensor_info("hn", np.float32, state),
            tensor_info("cn", np.float32, state),
        ],
        weights,
    )


@pytest.mark.anyio
async def test_an_lstm_state_with_an_unnamed_batch_is_sized_from_x(core: ai.Core) -> None:
    model = lstm_hc_model()
    compiled = core.compile_model(model, "CPU", {"STATEFUL": "auto"})
    assert compiled.get_property("STATEFUL") == {"h": "hn", "c": "cn"}
    x = np.random.default_rng(3).standard_normal((7, 3, 4)).astype(np.float32)
    chunks = [{"X": x[a:b]} for a, b in ((0, 2), (2, 3), (3, 7))]
    want, last = onnxruntime_steps(model, chunks, {"h": "hn", "c": "cn"}, 3)
    request = compiled.create_infer_request()
    for chunk, (want_y,) in zip(chunks, want):
        got = (await request.infer(chunk))["Y"]
        np.testing.assert_allclose(got, want_y, rtol=RTOL, atol=ATOL)
    # And the same as the whole sequence at once.
    zeros = np.zeros((1, 3, HIDDEN), np.float32)
    whole = reference_outputs(model, {"X": x, "h": zeros, "c": zeros})
    states = {s.name: s.state for s in request.query_state()}
    np.testing.assert_allclose(states["h"], whole[1], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(states["c"], last["c"], rtol=RTOL, atol=ATOL)


def running_sum_model(state: Dims, x: Dims = ("n", 4)) -> onnx.ModelProto:
    """``total = state + x``: no node tells the size of an unnamed dimension of
    ``state`` (only ``x``'s leading batch can, when it has one)."""
    return make_model(
        [oh.make_node("Add", ["state", "x"], ["state_out"]), oh.make_node("Neg", ["x"], ["y"])],
        [tensor_info("x", np.float32, list(x)), tensor_info("state", np.float32, state)],
        [tensor_info("y", np.float32, list(x)), tensor_info("state_out", np.float32, state)],
    )


@pytest.mark.anyio
async def test_a_state_with_one_unknown_dimension_takes_the_inputs_batch(core: ai.Core) -> None:
    compiled = core.compile_model(running_sum_model(["?", 4]), "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    await request.infer({"x": x})  # from zeros [2, 4]: x's batch
    await request.infer({"x": x})
    np.testing.assert_array_equal(request.query_state()[0].state, 2 * x)


@pytest.mark.anyio
async def test_a_state_nothing_sizes_is_refused_until_given(core: ai.Core) -> None:
    # x's batch is static: no input has a batch to size the state from.
    compiled = core.compile_model(running_sum_model(["?", 4], [2, 4]), "CPU", {"STATEFUL": "auto"})
    assert compiled.get_property("STATEFUL") == {"state": "state_out"}
    request = compiled.create_infer_request()
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ai.MissingInputError) as info:
        await request.infer({"x": x})
    message = str(info.value)
    for part in ("'state'", "dimension 0", "[?, 4]", "query_state()", "model.reshape"):
        assert part in message, (part, message)
    # Given a value, the request runs from there.
    (state,) = request.query_state()
    assert repr(state) == "<VariableState 'state' without a value>"
    with pytest.raises(ai.MissingInputError, match="'state'"):
        state.state  # noqa: B018  (reading it tells the same)
    state.state = np.full((2, 4), 10, np.float32)
    await request.infer({"x": x})
    await request.infer({"x": x})
    np.testing.assert_array_equal(state.state, np.full((2, 4), 12, np.float32))
    # Or named before compiling, after an input's dimension.
    model = core.read_model(running_sum_model(["?", 4]))
    model.reshape({"state": ["n", 4]})
    request = core.compile_model(model, "CPU", {"STATEFUL": "auto"}).create_infer_request()
    await request.infer({"x": x})
    np.testing.assert_array_equal(request.query_state()[0].state, x)


def test_a_recurrent_state_whose_batch_nothing_tells_is_refused_not_zeroed(core: ai.Core) -> None:
    # X comes out of a Reshape to a run-time shape: no size for h's batch before running.
    model = lstm_hc_model()
    graph = model.graph
    graph.node[0].input[0] = "X_reshaped"
    graph.node.insert(0, oh.make_node("Reshape", ["X", "target"], ["X_reshaped"]))
    graph.input.append(tensor_info("target", np.int64, [3]))
    onnx.checker.check_model(model)
    request = core.compile_model(model, "CPU", {"STATEFUL": "auto"}).create_infer_request()
    x = np.random.default_rng(4).standard_normal((2, 6, 4)).astype(np.float32)
    feeds = {"X": x, "target": np.array([2, 6, 4], np.int64)}
    with pytest.raises(ai.MissingInputError, match="variable 'h'"):
        request.infer_sync(feeds)
    zeros = np.zeros((1, 6, HIDDEN), np.float32)
    for state in request.query_state():
        state.state = zeros
    got = request.infer_sync(feeds)["Y"]
    want = reference_outputs(model, {**feeds, "h": zeros, "c": zeros})[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
