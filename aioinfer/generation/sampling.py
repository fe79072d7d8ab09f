"""Per-sequence token choice: greedy or seeded sampling, penalties, log-probabilities,
stop tokens, length.

Each generation has its own :class:`Sampling` and its own :class:`Picker` (a numpy
Generator and the counts of the tokens it generated), so the tokens of a seeded
generation do not depend on what else runs in its batch: a batched step hands each
sequence its own row of logits and the sequence draws from its own Generator. Each
generated token is a :class:`Step`: the token, and when asked for, its log-probability
and the most likely alternatives.
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


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token, with its log-probability and the ``top_logprobs`` most
    likely tokens of that step, most likely first, when the sampling asked for them
    (:attr:`Sampling.logprobs`; else None and empty)."""

    token: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Sampling:
    """How one generation picks its tokens. ``temperature`` 0 is greedy (argmax: ``top_k``,
    ``top_p`` and ``seed`` do not matter); above 0 the logits are divided by it, cut to the
    ``top_k`` most likely tokens (0: all) and to the fewest most likely whose
    probabilities reach ``top_p``, and a token is drawn from what remains with numpy's
    Generator seeded with ``seed`` (None: from the OS).

    Before the choice, ``presence_penalty`` is subtracted from the logit of every token
    generated so far and ``frequency_penalty`` times its count (OpenAI's definition,
    over the generated tokens, not the prompt). With ``logprobs`` (0 or more), each
    :class:`Step` carries the log-probability of its token and of the ``logprobs`` most
    likely tokens, from the penalized logits before the temperature."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: frozenset[int] = field(default_factory=frozenset)
    """End-of-sequence and stop tokens: a generation that yields one ends."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    """How many most likely tokens each step reports beside its own (None: no
    log-probabilities)."""

    @property
    def plain(self) -> bool:
        """Whether the token is the argmax of the raw logits and nothing else is asked
        (greedy, no penalty, no log-probabilities): a batch picks those rows at once."""
        return (
            self.temperature == 0
            and self.logprobs is None
            and self.presence_penalty == 0
            and self.frequency_penalty == 0
        )

    def picker(self) -> Picker:
        """The per-generation state of this sampling (its Generator, its counts)."""
        return Picker(self)

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
        *,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logprobs: int | None = None,
        ignore_eos: bool = False,
    ) -> Sampling:
        """The settings of one generation (``max_new_tokens`` None: the config's; the
        config's end-of-sequence tokens stop it too, unless ``ignore_eos``).

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
        for name, penalty in (
            ("presence_penalty", presence_penalty),
            ("frequency_penalty", frequency_penalty),
        ):
            if (
                isinstance(penalty, bool)
                or not isinstance(penalty, (int, float))
                or not -2 <= penalty <= 2
            ):
                raise GenerationError(f"{name} must be a number in [-2, 2], got {penalty!r}")
        if not isinstance(ignore_eos, bool):
            raise GenerationError(f"ignore_eos must be true or false, got {ignore_eos!r}")
        eos = frozenset() if ignore_eos else frozenset(config.eos_token_id)
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
            stop=eos | frozenset(token_ids(stop, "stop")),
            presence_penalty=float(presence_penalty),
            frequency_penalty=float(frequency_penalty),
            logprobs=None if logprobs is None else count(logprobs, "logprobs", minimum=0),
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


class Picker:
    """The choice of one generation's tokens: its :class:`Sampling`, its own Generator
    (seeded with the sampling's ``seed``) and the counts of the tokens it chose (for the
    penalties)."""

    __slots__ = ("counts", "rng", "sampling")

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)
        self.counts: dict[int, int] = {}

    def choose(self, logits: np.ndarray) -> Step:
        """The next :class:`Step` from the last position's ``logits`` (``[vocab]``)."""
        sampling = self.sampling
        if self.counts and (sampling.presence_penalty or sampling.frequency_penalty):
            logits = logits.astype(np.float32, copy=True)
            ids = np.fromiter(self.counts, np.int64, len(self.counts))
            seen = np.fromiter(self.counts.values(), np.float32, len(self.counts))
            logits[ids] -= sampling.presence_penalty + sampling.frequency_penalty * seen
        token = sampling.pick(logits, self.rng)
        self.counts[token] = self.counts.get(token, 0) + 1
        if sampling.logprobs is None:
            return Step(token)
        scores = logits.astype(np.float64)
        shifted = scores - scores.max()
        logprobs = shifted - math.log(float(np.exp(shifted).sum()))
        top: tuple[tuple[int, float], ...] = ()
        if sampling.logprobs:
            k = min(sampling.logprobs, logprobs.size)
            best = np.argpartition(-logprobs, k - 1)[:k]
            best = best[np.argsort(-logprobs[best], kind="stable")]
            top = tuple((int(i), float(logprobs[i])) for i in best)
        return Step(token, float(logprobs[token]), top)


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
