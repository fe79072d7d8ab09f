"""The text models of tests/data/text (scripts/make_text_models.py) and their reference
outputs from sentence-transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TEXT_MODELS = Path(__file__).resolve().parent.parent / "data" / "text"
ST_EMBEDDER = TEXT_MODELS / "st-embedder"
FEATURE_EXTRACTION = TEXT_MODELS / "feature-extraction"
CROSS_ENCODER = TEXT_MODELS / "cross-encoder"

pytest.importorskip("tokenizers")


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    """reference.json: the texts and sentence-transformers' outputs for them."""
    return json.loads((TEXT_MODELS / "reference.json").read_text())


def cosines(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """The cosine similarity of each row of ``actual`` with the same row of ``expected``."""
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    return (actual * expected).sum(1) / (
        np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1)
    )
