"""The last-position rewrite of a decoder: the logits of the last position only, the same
numbers, on every device; greedy generation unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.errors import InvalidModelError
from aioinfer.generation import last_position_logits
from tests.helpers import hf_decoder, reference_outputs

DEVICES = ["CPU", "ORT", "OPENVINO"]


@pytest.fixture(scope="module", params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def prompt_batch(rows: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(3, 300, (rows, width))
    return {
        "input_ids": ids,
        "attention_mask": np.ones((rows, width), np.int64),
        "position_ids": np.tile(np.arange(width), (rows, 1)),
    }


@pytest.mark.anyio
async def test_a_prefill_gives_the_last_positions_logits_only_and_the_same_numbers(
    device: str,
) -> None:
    core = ai.Core()
    folder, cases, eos = hf_decoder("llama_gqa")
    full = core.read_model(folder / "model.onnx")
    last = last_position_logits(full)
    assert str(full.output("logits").shape[1]) != "1"  # the original is not changed
    assert last.output("logits").shape[1] == 1
    compiled = {
        "full": core.compile_model(full, device, {"STATEFUL": "auto", "LOGITS": "ALL"}),
        "last": core.compile_model(last, device, {"STATEFUL": "auto", "LOGITS": "ALL"}),
        "default": core.compile_model(full, device, {"STATEFUL": "auto"}),
    }
    feeds = prompt_batch(3, 9)
    logits = {}
    for kind, model in compiled.items():
        request = model.create_infer_request()
        logits[kind] = np.asarray((await request.infer(feeds))["logits"])
    assert logits["full"].shape[:2] == (3, 9)
    assert logits["last"].shape[:2] == (3, 1)
    np.testing.assert_allclose(logits["last"][:, 0], logits["full"][:, -1], rtol=1e-4, atol=1e-4)
    # A decoder compiled with STATEFUL gets the rewrite by default.
    assert compiled["default"].output("logits").shape[1] == 1
    np.testing.assert_allclose(logits["default"], logits["last"], rtol=1e-5, atol=1e-5)
    # Generation reads the last position anyway: greedy tokens equal transformers'.
    config = {"eos_token_id": list(eos)}
    for kind in ("last", "full"):
        for case in cases[::2]:
            tokens = ai.generate(compiled[kind], case.input_ids, max_new_tokens=16, config=config)
            assert [t async for t in tokens] == case.output_ids, f"{kind}: {len(case.input_ids)}"
        # Alone on a request (not through the scheduler): either shape too.
        case = cases[1]
        request = compiled[kind].create_infer_request()
        alone = ai.generate(
            compiled[kind], case.input_ids, max_new_tokens=16, config=config, request=request
        )
        assert [t async for t in alone] == case.output_ids, f"{kind}, alone"


def test_the_rewrite_applied_twice_slices_once() -> None:
    model = ai.Core().read_model(projection_model(SOFT_CAP))
    twice = last_position_logits(last_position_logits(model))
    assert [node.op_type for node in twice.ir.graph].count("Slice") == 1


@pytest.mark.anyio
async def test_logits_default_to_the_last_position_for_a_stateful_decoder_only(
    device: str,
) -> None:
    core = ai.Core()
    folder = hf_decoder("llama_gqa")[0]
    exported = core.read_model(folder / "model.onnx")
    feeds = prompt_batch(2, 5)
    cache = {
        p.name: np.zeros((2, 2, 0, 16), np.float32)
        for p in exported.inputs
        if p.name.startswith("past_key_values.")
    }
    cases = [  # config, feeds, positions of the logits
        ({"STATEFUL": "auto"}, feeds, 1),
        ({"STATEFUL": "auto", "LOGITS": "ALL"}, feeds, 5),
        ({"STATEFUL": "auto", "LOGITS": "last"}, feeds, 1),
        ({}, {**feeds, **cache}, 5),  # not stateful: as exported
        ({"LOGITS": "LAST"}, {**feeds, **cache}, 1),
    ]
    for config, fed, positions in cases:
        compiled = core.compile_model(exported, device, config)
        assert (str(compiled.output("logits").shape[1]) == "1") == (positions == 1), config
        got = await compiled.create_infer_request().infer(fed)
        assert np.asarray(got["logits"]).shape[:2] == (2, positions), config
        await compiled.close()
    # The model read is not changed by compiling it.
    assert str(exported.output("logits").shape[1]) == "sequence_length"


def test_a_bad_logits_value_or_a_last_position_that_cannot_be_sliced_is_refused() -> None:
    core = ai.Core()
    model = core.read_model(projection_model(SOFT_CAP))
    with pytest.raises(ai.InvalidPropertyValueError, match=r"'LOGITS'.*LAST, ALL"):
        core.compile_model(model, "CPU", {"LOGITS": "FIRST"})
    mixed = projection_model([oh.make_node("Add", ["projected", "projected"], ["logits"])])
    with pytest.raises(InvalidModelError, match="cannot be sliced"):
        core.compile_model(core.read_model(mixed), "CPU", {"LOGITS": "LAST"})
    # Without LOGITS the same model compiles as exported.
    assert str(core.compile_model(core.read_model(mixed), "CPU").output("logits").shape[1]) == "s"


def projection_model(after: list[onnx.NodeProto], weight_constant: bool = True) -> onnx.ModelProto:
    """``hidden [b, s, 4] @ W [4, 6]`` then ``after`` (reading ``projected``, the last one
    making ``logits``)."""
    rng = np.random.default_rng(3)
    weight = oh.make_tensor("W", onnx.TensorProto.FLOAT, [4, 6], rng.normal(size=24).tolist())
    bias = oh.make_tensor("bias", onnx.TensorProto.FLOAT, [6], rng.normal(size=6).tolist())
    scale = oh.make_tensor("scale", onnx.TensorProto.FLOAT, [], [0.5])
    inputs = [oh.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["b", "s", 4])]
    if not weight_constant:
        inputs.append(oh.make_tensor_value_info("W", onnx.TensorProto.FLOAT, [4, 6]))
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["hidden", "W"], ["projected"]), *after],
        "projection",
        inputs,
        [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["b", "s", 6])],
        [bias, scale] + ([weight] if weight_constant else []),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


SOFT_CAP = [
    oh.make_node("Add", ["projected", "bias"], ["biased"]),
    oh.make_node("Mul", ["biased", "scale"], ["scaled"]),
    oh.make_node("Tanh", ["scaled"], ["logits"]),
]


@pytest.mark.anyio
async def test_elementwise_ops_by_constants_after_the_projection_are_kept(device: str) -> None:
    proto = projection_model(SOFT_CAP)
    hidden = np.random.default_rng(4).normal(size=(2, 5, 4)).astype(np.float32)
    (want,) = reference_outputs(proto, {"hidden": hidden})
    core = ai.Core()
    model = last_position_logits(core.read_model(proto))
    compiled = core.compile_model(model, device)
    got = np.asarray((await compiled.create_infer_request().infer({"hidden": hidden}))["logits"])
    assert got.shape == (2, 1, 6)
    np.testing.assert_allclose(got[:, 0], want[:, -1], rtol=1e-5, atol=1e-6)


def test_an_output_that_is_not_a_projection_by_a_constant_is_refused() -> None:
    core = ai.Core()
    with pytest.raises(InvalidModelError, match=r"no output 'scores' .*outputs: 'logits'"):
        last_position_logits(core.read_model(projection_model(SOFT_CAP)), "scores")
    variable_weight = projection_model([oh.make_node("Identity", ["projected"], ["logits"])], False)
    with pytest.raises(InvalidModelError, match="output 'logits' is not a MatMul by a constant"):
        last_position_logits(core.read_model(variable_weight))
    # A per-position op whose other operand is not a constant: refused, not guessed.
    mixed = projection_model([oh.make_node("Add", ["projected", "projected"], ["logits"])])
    with pytest.raises(InvalidModelError, match="cannot be sliced"):
        last_position_logits(core.read_model(mixed))


@pytest.mark.anyio
@pytest.mark.parametrize("virtual", ["AUTO", "AUTO:CPU", "PROCESS:CPU"])
async def test_a_virtual_device_compiles_its_target_with_the_choice_made_above(
    virtual: str,
) -> None:
    # The Core rewrites once, above the virtual device: its target's compile must not
    # choose again (with ALL, the target would otherwise take the default, LAST).
    core = ai.Core()
    exported = core.read_model(hf_decoder("llama_gqa")[0] / "model.onnx")
    feeds = prompt_batch(2, 5)
    for logits, positions in (("ALL", 5), ("LAST", 1), (None, 1)):
        config = {"STATEFUL": "auto"} if logits is None else {"STATEFUL": "auto", "LOGITS": logits}
        compiled = core.compile_model(exported, virtual, config)
        try:
            got = await compiled.create_infer_request().infer(feeds)
            assert np.asarray(got["logits"]).shape[:2] == (2, positions), (virtual, logits)
        finally:
            await compiled.close()
