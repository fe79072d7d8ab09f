"""Pooling: one vector per text from the encoder's token vectors, as sentence-transformers'
``Pooling`` module computes it, and normalization.

Every function takes the token vectors ``[batch, tokens, dim]`` and the attention mask
``[batch, tokens]`` (1 on real tokens, 0 on padding, on either side) and ignores the
padding, so that a text gets the same vector whatever batch it was padded in. Several
modes concatenate their vectors in the order given, as sentence-transformers does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

PoolingFunction = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _mask(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return mask[:, :, None].astype(tokens.dtype)


def _token_sum(tokens: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    weights = _mask(tokens, mask)
    total = np.einsum("btd,bto->bd", tokens, weights)
    count = np.maximum(weights.sum(axis=1), 1e-9)
    return total, count


def mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The mean of the real tokens' vectors."""
    total, count = _token_sum(tokens, mask)
    return total / count


def mean_sqrt_len(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The sum of the real tokens' vectors over the square root of their number."""
    total, count = _token_sum(tokens, mask)
    return total / np.sqrt(count)


def weighted_mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The mean weighted by position (1 for the first position, 2 for the second...)."""
    positions = np.arange(1, tokens.shape[1] + 1, dtype=tokens.dtype)
    weights = _mask(tokens, mask) * positions[None, :, None]
    total = np.einsum("btd,bto->bd", tokens, weights)
    return total / np.maximum(weights.sum(axis=1), 1e-9)


def cls(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The vector of the first real token (``[CLS]``; after left padding too)."""
    first = np.argmax(mask != 0, axis=1)
    return tokens[np.arange(len(tokens)), first]


def max_tokens(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The element-wise maximum over the real tokens."""
    return np.where(mask[:, :, None] != 0, tokens, -np.inf).max(axis=1).astype(tokens.dtype)


def last_token(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The vector of the last real token (right or left padding)."""
    real = mask != 0
    last = tokens.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)
    return tokens[np.arange(len(tokens)), last] * real.any(axis=1)[:, None]


POOLING: dict[str, PoolingFunction] = {
    "mean": mean,
    "cls": cls,
    "max": max_tokens,
    "lasttoken": last_token,
    "mean_sqrt_len_tokens": mean_sqrt_len,
    "weightedmean": weighted_mean,
}
"""The modes by the names of sentence-transformers' ``pooling_mode``."""

LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""The boolean keys of older ``1_Pooling/config.json`` files, in the order their vectors
are concatenated."""


def pool(tokens: np.ndarray, mask: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """The vectors of ``modes`` (names of :data:`POOLING`), concatenated."""
    vectors = [POOLING[mode](tokens, mask) for mode in modes]
    return vectors[0] if len(vectors) == 1 else np.concatenate(vectors, axis=1)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
