"""aioinfer.generate against Hugging Face transformers on decoders exported by optimum.

The decoders (``tests/data/decoders``, made by ``scripts/make_decoder.py``) are what users
export: ``optimum-cli export onnx --task text-generation-with-past`` of a Llama with
random weights, grouped-query and multi-head attention, 2 layers. The reference is
transformers' ``generate(do_sample=False, max_new_tokens=16)`` on the same weights, for
prompts of 1 to 100 tokens; token ids compare exactly (the smallest gap between the two
largest logits of any reference step is recorded with it and checked to be far above
float32 differences between runtimes).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import aioinfer as ai
from tests.helpers import hf_decoder

pytestmark = pytest.mark.anyio

NAMES = ["llama_gqa", "llama_mha"]
DEVICES = ["CPU", "ORT", "OPENVINO"]


@pytest.fixture(scope="module", params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=DEVICES)
def compiled(name: str, request: pytest.FixtureRequest) -> ai.CompiledModel:
    folder, _, _ = hf_decoder(name)
    return ai.Core().compile_model(folder / "model.onnx", request.param, {"STATEFUL": "auto"})


def test_the_exports_are_optimum_decoders_with_the_attention_their_name_says() -> None:
    for name, kv_heads in (("llama_gqa", 2), ("llama_mha", 4)):
        folder, cases, eos = hf_decoder(name)
        model = onnx.load(folder / "model.onnx")
        inputs = {i.name: i.type.tensor_type.shape for i in model.graph.input}
        assert list(inputs)[:3] == ["input_ids", "attention_mask", "position_ids"]
        assert list(inputs)[3:] == [
            f"past_key_values.{layer}.{kind}" for layer in (0, 1) for kind in ("key", "value")
        ]
        assert inputs["past_key_values.0.key"].dim[1].dim_value == kv_heads
        assert {"config.json", "generation_config.json", "tokenizer.json"} <= {
            path.name for path in folder.iterdir()
        }
        assert eos == (2,)
        assert sorted({len(case.input_ids) for case in cases}) == [1, 4, 15, 33, 79, 100]
        # Varied tokens (a KV cache that went wrong would show) and decisive argmaxes.
        assert len({t for case in cases for t in case.output_ids}) > 30
        assert min(case.min_logit_gap for case in cases) > 5e-4


async def test_greedy_tokens_equal_transformers_generate(
    name: str, compiled: ai.CompiledModel
) -> None:
    _, cases, eos = hf_decoder(name)
    config = {"eos_token_id": list(eos)}
    for case in cases:
        tokens = ai.generate(compiled, case.input_ids, max_new_tokens=16, config=config)
        assert [t async for t in tokens] == case.output_ids, f"prompt of {len(case.input_ids)}"
    # A [1, n] int64 array prompt, as a tokenizer returns it: the same.
    longest = cases[-1]
    prompt = np.array([longest.input_ids], np.int64)
    tokens = ai.generate(compiled, prompt, max_new_tokens=16, config=config)
    assert [t async for t in tokens] == longest.output_ids
