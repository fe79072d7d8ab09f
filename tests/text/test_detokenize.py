"""Incremental detokenizing: chunks that never split a UTF-8 character and join into the
whole text; stop strings matched across token boundaries and cut out."""

from __future__ import annotations

import pytest

from aioinfer.text import IncrementalDetokenizer, StopStrings
from tests.helpers import HF_DECODERS

tokenizers = pytest.importorskip("tokenizers")

TEXT = "Grüße 😀 — naïve café, 東京!"


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return tokenizers.Tokenizer.from_file(str(HF_DECODERS / "llama_gqa" / "tokenizer.json"))


def test_chunks_never_split_a_character_and_join_into_the_text(tokenizer: object) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids  # type: ignore[attr-defined]
    # The byte-level vocabulary of 320 tokens splits most of these characters in bytes.
    singles = [tokenizer.decode([i]) for i in ids]  # type: ignore[attr-defined]
    assert sum("\ufffd" in text for text in singles) > 5  # the control: token by token
    prompt = tokenizer.encode("Hello", add_special_tokens=True).ids  # type: ignore[attr-defined]
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    chunks = [detokenizer.push(i) for i in ids]
    chunks.append(detokenizer.flush())
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert "".join(chunks) == TEXT
    assert sum(bool(chunk) for chunk in chunks) > 10  # it streams, not all at the end


def test_an_unfinished_character_at_the_end_decodes_as_a_whole_decode(tokenizer: object) -> None:
    ids = tokenizer.encode("ok 😀", add_special_tokens=False).ids[:-1]  # type: ignore[attr-defined]
    detokenizer = IncrementalDetokenizer(tokenizer)
    text = "".join(detokenizer.push(i) for i in ids) + detokenizer.flush()
    assert text == tokenizer.decode(ids)  # type: ignore[attr-defined]
    assert text.startswith("ok ") and text.endswith("\ufffd")


def test_special_tokens_are_skipped_unless_asked(tokenizer: object) -> None:
    plain = IncrementalDetokenizer(tokenizer)
    assert plain.push(2) + plain.flush() == ""
    special = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert special.push(2) + special.flush() == "</s>"


def test_stop_strings_across_chunks_are_cut_out() -> None:
    stops = StopStrings(["STOP", "x"])
    out = [stops.feed(piece) for piece in ["ab", "cS", "T", "OPdef"]]
    assert "".join(out) == "abc" and stops.matched == "STOP"
    assert stops.feed("more") == ""
    earliest = StopStrings(["cd", "b"])
    assert earliest.feed("abcd") == "a" and earliest.matched == "b"
    none = StopStrings(["zz"])
    assert none.feed("abz") == "ab"  # "z" could begin "zz": held back
    assert none.flush() == "z" and none.matched is None
