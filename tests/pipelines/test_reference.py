"""Embeddings and rerank scores equal sentence-transformers' on the same weights, on
every device of AUTO's list (CPU, ORT, OPENVINO)."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import numpy as np
import pytest

import aioinfer
from tests.pipelines.conftest import CROSS_ENCODER, FEATURE_EXTRACTION, ST_EMBEDDER, cosines

pytestmark = pytest.mark.anyio

DEVICES = [
    "CPU",
    pytest.param("ORT", marks=pytest.mark.skipif(not find_spec("onnxruntime"), reason="no ORT")),
    pytest.param("OPENVINO", marks=pytest.mark.skipif(not find_spec("openvino"), reason="no OV")),
]


@pytest.mark.parametrize("device", DEVICES)
async def test_sentence_transformers_folder_equals_encode(
    device: str, reference: dict[str, Any]
) -> None:
    ref = reference["embeddings"]
    async with await aioinfer.TextEmbedder.load(ST_EMBEDDER, device) as embedder:
        assert embedder.max_length == ref["max_seq_length"]
        assert embedder.normalizes
        normalized = await embedder.embed(ref["texts"])
        raw = await embedder.embed(ref["texts"], normalize=False)
        prompted = await embedder.embed(ref["texts"], prompt_name="query")
        truncated = await embedder.embed(ref["texts"], dimensions=16)
    assert normalized.dtype == np.float32 and normalized.shape == (len(ref["texts"]), 32)
    assert cosines(normalized, ref["normalized"]).min() >= 0.9999
    np.testing.assert_allclose(normalized, ref["normalized"], atol=1e-5)
    np.testing.assert_allclose(raw, ref["unnormalized"], rtol=1e-4, atol=1e-5)
    assert cosines(prompted, ref["query_prompt"]).min() >= 0.9999
    assert truncated.shape == (len(ref["texts"]), 16)
    np.testing.assert_allclose(truncated, ref["truncate_dim_16"], atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
async def test_feature_extraction_export_mean_pools(device: str, reference: dict[str, Any]) -> None:
    ref = reference["embeddings"]
    async with await aioinfer.TextEmbedder.load(FEATURE_EXTRACTION, device) as embedder:
        assert embedder.max_length == ref["tokenizer_max_length"]
        assert not embedder.normalizes
        vectors = await embedder.embed(ref["texts"])
    assert cosines(vectors, ref["feature_extraction"]).min() >= 0.9999
    np.testing.assert_allclose(vectors, ref["feature_extraction"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
async def test_rerank_scores_equal_cross_encoder_predict(
    device: str, reference: dict[str, Any]
) -> None:
    ref = reference["rerank"]
    async with await aioinfer.TextReranker.load(CROSS_ENCODER, device) as reranker:
        results = await reranker.rerank(ref["query"], ref["documents"])
        top = await reranker.rerank(ref["query"], ref["documents"], top_n=2)
    expected = ref["scores"]
    assert [r.index for r in results] == sorted(range(len(expected)), key=lambda i: -expected[i])
    for result in results:
        assert result.score == pytest.approx(expected[result.index], abs=1e-4)
    assert top == results[:2]


async def test_auto_is_the_default_device(reference: dict[str, Any]) -> None:
    ref = reference["embeddings"]
    async with await aioinfer.TextEmbedder.load(ST_EMBEDDER) as embedder:
        assert embedder.compiled.get_property("EXECUTION_DEVICES")
        vectors = await embedder.embed(ref["texts"])
    assert cosines(vectors, ref["normalized"]).min() >= 0.9999


async def test_truncation_at_max_seq_length(reference: dict[str, Any]) -> None:
    ref = reference["embeddings"]
    long_index = ref["texts"].index(max(ref["texts"], key=len))
    assert ref["token_counts"][long_index] == ref["max_seq_length"]
    async with await aioinfer.TextEmbedder.load(ST_EMBEDDER, "CPU") as embedder:
        encodings = await embedder.tokenizer.encode([ref["texts"][long_index]])
        vector = await embedder.embed([ref["texts"][long_index]])
        with pytest.raises(
            aioinfer.TextTooLongError, match=r"text 0 has \d+ tokens.*maximum of 24"
        ):
            await embedder.embed([ref["texts"][long_index]], truncate=False)
        short = await embedder.embed([ref["texts"][0]], truncate=False)
    assert len(encodings[0]) == ref["max_seq_length"]
    assert cosines(vector, [ref["normalized"][long_index]]).min() >= 0.9999
    assert cosines(short, [ref["normalized"][0]]).min() >= 0.9999
