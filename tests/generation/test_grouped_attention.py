"""Grouped-query attention without the repeated cache: the same logits, prefill and
decode, on every device; greedy generation unchanged; multi-head attention untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.generation import grouped_query_attention
from aioinfer.transforms.compile_rewrites import compile_rewrites
from tests.helpers import hf_decoder, reference_outputs

ort = pytest.importorskip("onnxruntime")

DEVICES = ["CPU", "ORT", "OPENVINO"]


def expands(model: ai.Model) -> int:
    return sum(node.op_type == "Expand" for node in model.ir.graph)


def test_the_repeat_of_each_layers_keys_and_values_goes_and_mha_is_left_alone() -> None:
    core = ai.Core()
    gqa = core.read_model(hf_decoder("llama_gqa")[0] / "model.onnx")
    grouped = grouped_query_attention(gqa)
    # Two layers, keys and values: four repeats; the causal mask's own Expands stay.
    assert expands(gqa) - expands(grouped) == 4
    assert expands(gqa) == 6  # the original is not changed
    mha = core.read_model(hf_decoder("llama_mha")[0] / "model.onnx")
    assert expands(grouped_query_attention(mha)) == expands(mha)
    assert len(list(grouped_query_attention(mha).ir.graph)) == len(list(mha.ir.graph))


def test_every_compile_groups_the_query_heads_and_leaves_mha_alone() -> None:
    core = ai.Core()
    gqa = core.read_model(hf_decoder("llama_gqa")[0] / "model.onnx")
    for config in ({}, {"STATEFUL": "auto"}, {"STATEFUL": "auto", "LOGITS": "ALL"}):
        rewritten, rest = compile_rewrites(gqa, config)
        assert expands(gqa) - expands(rewritten) == 4, config
        assert "LOGITS" not in rest
    mha = core.read_model(hf_decoder("llama_mha")[0] / "model.onnx")
    assert compile_rewrites(mha, {"LOGITS": "ALL"})[0] is mha  # not even copied


def exported_logits(path: Path, steps: list[tuple[np.ndarray, int]], rows: int) -> list[np.ndarray]:
    """The logits of each step of the decoder at ``path`` as exported (onnxruntime on the
    file itself, the cache handed from each step to the next)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    cache = {
        i.name: np.zeros((rows, i.shape[1], 0, i.shape[3]), np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    logits = []
    for fed, past in steps:
        total = past + fed.shape[1]
        feeds = {
            "input_ids": fed,
            "attention_mask": np.ones((rows, total), np.int64),
            "position_ids": np.tile(np.arange(past, total), (rows, 1)),
            **cache,
        }
        outputs = dict(zip(names, session.run(None, feeds), strict=True))
        cache = {name: outputs[name.replace("past_key_values", "present")] for name in cache}
        logits.append(outputs["logits"])
    return logits


@pytest.mark.anyio
@pytest.mark.parametrize("device", DEVICES)
async def test_prefill_and_decode_logits_are_the_same_numbers(device: str) -> None:
    core = ai.Core()
    folder, cases, eos = hf_decoder("llama_gqa")
    exported = core.read_model(folder / "model.onnx")
    compiled = {
        # Compiled as given, the repeat is grouped by default.
        "default": core.compile_model(exported, device, {"STATEFUL": "auto", "LOGITS": "ALL"}),
        "grouped": core.compile_model(
            grouped_query_attention(exported), device, {"STATEFUL": "auto", "LOGITS": "ALL"}
        ),
    }
    rows, width = 3, 7
    ids = np.random.default_rng(1).integers(3, 300, (rows, width + 4))
    steps = [(ids[:, :width], 0)] + [(ids[:, i : i + 1], i) for i in range(width, width + 4)]
    logits: dict[str, list[np.ndarray]] = {
        "exported": exported_logits(folder / "model.onnx", steps, rows)
    }
    for kind, model in compiled.items():
        request = model.create_infer_request()
        logits[kind] = []
        for fed, past in steps:
            total = past + fed.shape[1]
            feeds = {
                "input_ids": fed,
                "attention_mask": np.ones((rows, total), np.int64),
                "position_ids": np.tile(np.arange(past, total), (rows, 1)),
            }
            logits[kind].append(np.asarray((await request.infer(feeds))["logits"]))
    for kind in compiled:
        for want, got in zip(logits["exported"], logits[kind], strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # With the last-position rewrite too (both by default): greedy tokens equal
    # transformers'.
    generating = core.compile_model(exported, device, {"STATEFUL": "auto"})
    config = {"eos_token_id": list(eos)}
    for case in cases[1::2]:
        tokens = ai.generate(generating, case.input_ids, max_new_tokens=16, config=config)
        assert [t async for t in tokens] == case.output_ids, f"prompt of {len(case.input_ids)}"


def repeat_model(merged: list[int]) -> onnx.ModelProto:
    """``probs [b, 4, 3, 6] @ Reshape(Expand(Unsqueeze(values [b, 2, 6, 5], 2)), merged)``:
    the 2 value heads repeated twice, merged back as ``merged`` says (0: the batch)."""
    parts = [
        oh.make_tensor(f"part{i}", onnx.TensorProto.INT64, [1], [v]) for i, v in enumerate(merged)
    ]
    nodes = [
        oh.make_node("Unsqueeze", ["values", "axis2"], ["unsqueezed"]),
        oh.make_node("Expand", ["unsqueezed", "repeat"], ["repeated"]),
        oh.make_node("Concat", [f"part{i}" for i in range(4)], ["merged_shape"], axis=0),
        oh.make_node("Reshape", ["repeated", "merged_shape"], ["merged"]),
        oh.make_node("MatMul", ["probs", "merged"], ["out"]),
    ]
    graph = oh.make_graph(
        nodes,
        "repeat",
        [
            oh.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["b", 4, 3, 6]),
            oh.make_tensor_value_info("values", onnx.TensorProto.FLOAT, ["b", 2, 6, 5]),
        ],
        [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["b", 4, 3, 5])],
        [
            oh.make_tensor("axis2", onnx.TensorProto.INT64, [1], [2]),
            oh.make_tensor("repeat", onnx.TensorProto.INT64, [5], [1, 1, 2, 1, 1]),
            *parts,
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


@pytest.mark.anyio
async def test_a_repeat_merged_into_the_heads_is_grouped_and_any_other_merge_left_alone() -> None:
    core = ai.Core()
    rng = np.random.default_rng(5)
    # [b, 2 * 2, 6, 5]: the heads merged, as repeat_kv does: rewritten, the same numbers.
    heads = repeat_model([0, 4, 6, 5])
    feeds = {
        "probs": rng.normal(size=(2, 4, 3, 6)).astype(np.float32),
        "values": rng.normal(size=(2, 2, 6, 5)).astype(np.float32),
    }
    grouped = grouped_query_attention(core.read_model(heads))
    assert expands(grouped) == 0
    (want,) = reference_outputs(heads, feeds)
    result = await core.compile_model(grouped, "ORT").create_infer_request().infer(feeds)
    np.testing.assert_allclose(np.asarray(result["out"]), want, rtol=1e-5, atol=1e-6)
    # [b, 2, 2 * 6, 5]: the repeat merged into the positions; not a grouped attention.
    positions = core.read_model(repeat_model([0, 2, 12, 5]))
    assert expands(grouped_query_attention(positions)) == 1
