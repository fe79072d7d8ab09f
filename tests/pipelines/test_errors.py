"""Bad inputs and folders raise specific aioinfer errors naming the problem, and the
pipeline stays usable after them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioinfer
from tests.pipelines.conftest import CROSS_ENCODER, FEATURE_EXTRACTION, ST_EMBEDDER

pytestmark = pytest.mark.anyio


async def test_bad_texts_raise_and_leave_the_embedder_usable(reference: dict[str, Any]) -> None:
    texts = reference["embeddings"]["texts"]
    async with await aioinfer.TextEmbedder.load(ST_EMBEDDER, "CPU") as embedder:
        with pytest.raises(aioinfer.TextInputError, match="at least one text, got an empty"):
            await embedder.embed([])
        with pytest.raises(aioinfer.TextTypeError, match="list of strings, got str"):
            await embedder.embed("one string")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"texts\[1\]: expected a string, got int"):
            await embedder.embed(["fine", 3])  # type: ignore[list-item]
        with pytest.raises(aioinfer.TextTooLongError, match=r"text 1 has .* maximum of 24"):
            await embedder.embed(["short", " ".join(texts)], truncate=False)
        with pytest.raises(aioinfer.TextInputError, match=r"one of \['document', 'query'\]"):
            await embedder.embed(texts, prompt_name="nope")
        for bad in (0, 33):
            with pytest.raises(aioinfer.TextInputError, match=f"1 to 32.*got {bad}"):
                await embedder.embed(texts, dimensions=bad)
        vectors = await embedder.embed(texts)
    np.testing.assert_allclose(vectors, reference["embeddings"]["normalized"], atol=1e-5)


async def test_bad_rerank_arguments_raise() -> None:
    async with await aioinfer.TextReranker.load(CROSS_ENCODER, "CPU") as reranker:
        with pytest.raises(aioinfer.TextInputError, match="documents: expected at least one"):
            await reranker.rerank("query", [])
        with pytest.raises(aioinfer.TextTypeError, match="query: expected a string, got NoneType"):
            await reranker.rerank(None, ["doc"])  # type: ignore[arg-type]
        with pytest.raises(aioinfer.TextInputError, match="top_n: expected a positive int"):
            await reranker.rerank("query", ["doc"], top_n=0)
        with pytest.raises(aioinfer.TextTooLongError, match="maximum of 48"):
            await reranker.rerank("query", ["word " * 60], truncate=False)
        assert len(await reranker.rerank("query", ["doc", "other doc"])) == 2


async def test_a_folder_of_the_other_kind_is_refused() -> None:
    with pytest.raises(
        aioinfer.ModelFolderError, match=r"TextEmbedder expected .*text-classification"
    ):
        await aioinfer.TextEmbedder.load(CROSS_ENCODER, "CPU")
    with pytest.raises(
        aioinfer.ModelFolderError, match=r"TextReranker expected .*sentence-transformers"
    ):
        await aioinfer.TextReranker.load(ST_EMBEDDER, "CPU")


def _copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


async def test_broken_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(aioinfer.ModelFolderError, match="no directory"):
        await aioinfer.TextEmbedder.load(tmp_path / "missing", "CPU")

    folder = _copy(FEATURE_EXTRACTION, tmp_path)
    (folder / "model.onnx").unlink()
    with pytest.raises(
        aioinfer.ModelFolderError, match=r"expected an ONNX model at onnx/model.onnx"
    ):
        await aioinfer.TextEmbedder.load(folder, "CPU")

    folder = _copy(ST_EMBEDDER, tmp_path / "dense")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append(
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(
        aioinfer.ModelFolderError, match=r"got \['Transformer', 'Pooling', 'Normalize', 'Dense'\]"
    ):
        await aioinfer.TextEmbedder.load(folder, "CPU")

    folder = _copy(ST_EMBEDDER, tmp_path / "pooling")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "median"}))
    with pytest.raises(aioinfer.ModelFolderError, match=r"pooling modes among .* got \['median'\]"):
        await aioinfer.TextEmbedder.load(folder, "CPU")

    folder = _copy(ST_EMBEDDER, tmp_path / "tokenizer")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(aioinfer.ModelFolderError, match=r"expected a tokenizer.json"):
        await aioinfer.TextEmbedder.load(folder, "CPU")


async def test_older_pooling_flags_and_max_seq_length_are_read(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Folders written by sentence-transformers before 5.0: ``pooling_mode_*_tokens``
    flags, ``max_seq_length`` in ``sentence_bert_config.json``."""
    folder = _copy(ST_EMBEDDER, tmp_path)
    flags = {
        "word_embedding_dimension": 32,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = 512  # capped at max_position_embeddings otherwise
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    async with await aioinfer.TextEmbedder.load(folder, "CPU") as embedder:
        assert embedder.max_length == 24
        vectors = await embedder.embed(reference["embeddings"]["texts"])
    np.testing.assert_allclose(vectors, reference["embeddings"]["normalized"], atol=1e-5)
