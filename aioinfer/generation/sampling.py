"""Per-sequence token choice: greedy or seeded sampling, stop tokens, length.

Each generation has its own :class:`Sampling` and its own numpy Generator, so the tokens
of a seeded generation do not depend on what else runs in its batch: a batched step hands
each sequence its own row of logits and the sequence draws from its own Generator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from aioinfer.errors import GenerationError
from aioinfer.generation.config import GenerationConfig, count, token_ids

FINISH_LENGTH = "length"
"""The finish reason of a generation that produced ``max_new_tokens`` tokens."""
FINISH_STOP = "stop"
"""The finish reason of a generation that produced an end-of-sequence or stop token."""


@dataclass(frozen=True)
class Sampling:
    """How one generation picks its tokens. ``temperature`` 0 is greedy (argmax: ``top_k``,
    ``top_p`` and ``seed`` do not matter); above 0 the logits are divided by it, cut to the
    ``top_k`` most likely tokens (0: all) and to the fewest most likely whose
    probabilities reach ``top_p``, and a token is drawn from what remains with numpy's
    Generator seeded with ``seed`` (None: from the OS)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: frozenset[int] = field(default_factory=frozenset)
    """End-of-sequence and stop tokens: a generation that yields one ends."""

    @classmethod
    def of(
        cls,
        config: GenerationConfig,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Iterable[int] = (),
    ) -> Sampling:
        """The settings of one generation (``max_new_tokens`` None: the config's; the
        config's end-of-sequence tokens stop it too).

        Raises:
            GenerationError: a value out of range or of the wrong type (named).
        """
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise GenerationError(f"temperature must be a number, got {temperature!r}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise GenerationError(f"temperature must be finite and at least 0, got {temperature}")
        if top_p is not None and (
            isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
        ):
            raise GenerationError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise GenerationError(f"seed must be an integer at least 0, got {seed!r}")
        return cls(
            max_new_tokens=(
                config.max_new_tokens
                if max_new_tokens is None
                else count(max_new_tokens, "max_new_tokens")
            ),
            temperature=float(temperature),
            top_k=0 if top_k is None else count(top_k, "top_k", minimum=0),
            top_p=1.0 if top_p is None else float(top_p),
            seed=seed,
            stop=frozenset(config.eos_token_id) | frozenset(token_ids(stop, "stop")),
        )

    def finish_reason(self, token: int, produced: int) -> str | None:
        """Why the generation ends after ``token``, its ``produced``-th token; None when
        it goes on."""
        if token in self.stop:
            return FINISH_STOP
        if produced >= self.max_new_tokens:
            return FINISH_LENGTH
        return None

    def pick(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """The next token from the last position's ``logits`` (``[vocab]``)."""
        if self.temperature == 0:
            return int(np.argmax(logits))
        scores = logits.astype(np.float64) / self.temperature
        if 0 < self.top_k < scores.size:
            kth = np.partition(scores, -self.top_k)[-self.top_k]
            scores = np.where(scores >= kth, scores, -np.inf)
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        if self.top_p < 1:
            order = np.argsort(-probabilities, kind="stable")
            reached = np.cumsum(probabilities[order])
            kept = order[: min(int(np.searchsorted(reached, self.top_p)) + 1, order.size)]
            cut = np.zeros_like(probabilities)
            cut[kept] = probabilities[kept]
            probabilities = cut / cut.sum()
        cumulative = np.cumsum(probabilities)
        drawn = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(drawn, probabilities.size - 1)


def last_logits(logits: object, name: str) -> np.ndarray:
    """The last position's logits of every row: ``[batch, vocab]`` from ``logits``
    (``[batch, sequence, vocab]`` or ``[batch, vocab]``).

    Raises:
        GenerationError: another rank (``name`` is the output's).
    """
    array = np.asarray(logits)
    if array.ndim == 3:
        return array[:, -1]
    if array.ndim == 2:
        return array
    raise GenerationError(
        f"output {name!r} (the logits) has shape {list(array.shape)}; expected [batch, "
        "sequence, vocab] or [batch, vocab]"
    )
