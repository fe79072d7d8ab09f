"""Pooling ignores padding on either side and equals the per-text computation."""

from __future__ import annotations

import numpy as np
import pytest

from aioinfer.pipelines.pooling import POOLING, normalize, pool

LENGTHS = [5, 1, 3]


def per_text(mode: str, vectors: np.ndarray) -> np.ndarray:
    """``mode`` computed on one text's real token vectors ``[tokens, dim]``."""
    n = len(vectors)
    return {
        "mean": vectors.mean(0),
        "cls": vectors[0],
        "max": vectors.max(0),
        "lasttoken": vectors[-1],
        "mean_sqrt_len_tokens": vectors.sum(0) / np.sqrt(n),
        "weightedmean": (vectors * np.arange(1, n + 1)[:, None]).sum(0) / np.arange(1, n + 1).sum(),
    }[mode]


@pytest.mark.parametrize(
    ("mode", "side"),
    # Weighted mean weighs by padded position, as sentence-transformers does: a text's own
    # positions only with right padding.
    [
        (mode, side)
        for mode in sorted(POOLING)
        for side in ("right", "left")
        if (mode, side) != ("weightedmean", "left")
    ],
)
def test_pooling_ignores_padding(mode: str, side: str) -> None:
    rng = np.random.default_rng(3)
    longest = max(LENGTHS)
    tokens = rng.normal(size=(len(LENGTHS), longest, 4)).astype(np.float32)
    mask = np.zeros((len(LENGTHS), longest), dtype=np.int64)
    texts = []
    for row, n in enumerate(LENGTHS):
        span = slice(longest - n, longest) if side == "left" else slice(0, n)
        mask[row, span] = 1
        texts.append(tokens[row, span])
    expected = np.stack([per_text(mode, text) for text in texts])
    np.testing.assert_allclose(pool(tokens, mask, [mode]), expected, rtol=1e-5, atol=1e-6)


def test_modes_concatenate_in_order_and_normalize() -> None:
    rng = np.random.default_rng(4)
    tokens = rng.normal(size=(2, 3, 4)).astype(np.float32)
    mask = np.ones((2, 3), dtype=np.int64)
    both = pool(tokens, mask, ["cls", "mean"])
    np.testing.assert_allclose(both[:, :4], tokens[:, 0])
    np.testing.assert_allclose(both[:, 4:], tokens.mean(1), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(normalize(both), axis=1), 1.0, rtol=1e-6)
    assert not normalize(np.zeros((1, 4))).any()
