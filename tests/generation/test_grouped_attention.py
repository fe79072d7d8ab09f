"""Grouped-query attention without the repeated cache: the same logits, prefill and
decode, on every device; greedy generation unchanged; multi-head attention untouched."""

from __future__ import annotations

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.generation import grouped_query_attention, last_position_logits
from tests.helpers import hf_decoder

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


@pytest.mark.anyio
@pytest.mark.parametrize("device", DEVICES)
async def test_prefill_and_decode_logits_are_the_same_numbers(device: str) -> None:
    core = ai.Core()
    folder, cases, eos = hf_decoder("llama_gqa")
    exported = core.read_model(folder / "model.onnx")
    compiled = {
        "repeat": core.compile_model(exported, device, {"STATEFUL": "auto"}),
        "grouped": core.compile_model(
            grouped_query_attention(exported), device, {"STATEFUL": "auto"}
        ),
    }
    rows, width = 3, 7
    ids = np.random.default_rng(1).integers(3, 300, (rows, width + 4))
    steps = [(ids[:, :width], 0)] + [(ids[:, i : i + 1], i) for i in range(width, width + 4)]
    logits: dict[str, list[np.ndarray]] = {}
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
    for want, got in zip(logits["repeat"], logits["grouped"], strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # With the last-position rewrite too: greedy tokens equal transformers'.
    both = last_position_logits(grouped_query_attention(exported))
    generating = core.compile_model(both, device, {"STATEFUL": "auto"})
    config = {"eos_token_id": list(eos)}
    for case in cases[1::2]:
        tokens = ai.generate(generating, case.input_ids, max_new_tokens=16, config=config)
        assert [t async for t in tokens] == case.output_ids, f"prompt of {len(case.input_ids)}"
