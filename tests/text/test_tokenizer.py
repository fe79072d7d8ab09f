"""The tokenizer of a model folder: its config files' max length, padding side and
special tokens; truncation as transformers does; encoding off the loop."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

import aioinfer
from tests.pipelines.conftest import CROSS_ENCODER, FEATURE_EXTRACTION, ST_EMBEDDER

pytest.importorskip("tokenizers")
from aioinfer.text import Tokenizer


def test_reads_max_length_and_special_tokens_from_the_folder() -> None:
    tokenizer = Tokenizer.from_folder(ST_EMBEDDER)
    assert tokenizer.max_length == 24
    assert tokenizer.padding_side == "right"
    assert tokenizer.special_tokens["pad"] == "[PAD]"
    assert tokenizer.pad_token_id == tokenizer.token_to_id("[PAD]") == 0
    assert Tokenizer.from_folder(FEATURE_EXTRACTION).max_length == 48
    assert Tokenizer.from_folder(FEATURE_EXTRACTION, max_length=10).max_length == 10
    tokenizer.close()


def test_truncates_as_transformers_or_refuses() -> None:
    tokenizer = Tokenizer.from_folder(ST_EMBEDDER)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    long_text = "the quick brown fox " * 20
    (cut,) = tokenizer.encode_sync([long_text])
    assert len(cut) == 24 and cut.ids[0] == cls and cut.ids[-1] == sep
    with pytest.raises(aioinfer.TextTooLongError, match=r"text 0 has 82 tokens, more than .* 24"):
        tokenizer.encode_sync([long_text], truncate=False)
    (short,) = tokenizer.encode_sync(["the quick"], truncate=False)
    assert short.ids.tolist() == [*cut.ids[:3].tolist(), sep]
    tokenizer.close()


def test_pairs_get_segment_ids_and_longest_first_truncation() -> None:
    tokenizer = Tokenizer.from_folder(CROSS_ENCODER)
    (pair,) = tokenizer.encode_sync([("what is paris", "paris is the capital of france")])
    sep = tokenizer.token_to_id("[SEP]")
    first_sep = pair.ids.tolist().index(sep)
    assert set(pair.type_ids[: first_sep + 1].tolist()) == {0}
    assert set(pair.type_ids[first_sep + 1 :].tolist()) == {1}
    (cut,) = tokenizer.encode_sync([("what is paris", "the dog " * 40)])
    assert len(cut) == 48
    assert cut.ids[: first_sep + 1].tolist() == pair.ids[: first_sep + 1].tolist()  # query kept
    tokenizer.close()


def test_padding_side_from_the_config(tmp_path: Path) -> None:
    folder = tmp_path / "left"
    shutil.copytree(ST_EMBEDDER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["padding_side"] = "left"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_folder(folder).padding_side == "left"


@pytest.mark.anyio
async def test_encode_runs_on_the_tokenizers_own_thread() -> None:
    tokenizer = Tokenizer.from_folder(ST_EMBEDDER)
    seen: list[str] = []
    original = tokenizer.encode_sync

    def recording(texts: list[str], *, truncate: bool = True) -> list:  # type: ignore[type-arg]
        seen.append(threading.current_thread().name)
        return original(texts, truncate=truncate)

    tokenizer.encode_sync = recording  # type: ignore[method-assign]
    (encoding,) = await tokenizer.encode(["hello"])
    assert len(encoding) == 3
    assert seen == ["aioinfer-tokenizer-0"]
    assert threading.current_thread().name != seen[0]
    tokenizer.close()
