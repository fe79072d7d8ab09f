"""How generation drives a decoder: its ports, end-of-sequence tokens, default length,
and the limits of the scheduler that batches its generations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from aioinfer.errors import GenerationError
from aioinfer.model import Port
from aioinfer.plugin.compiled_model import CompiledModel

_LIMITS = (
    "max_running_sequences",
    "max_step_tokens",
    "max_waiting_sequences",
    "max_buffered_tokens",
)


@dataclass(frozen=True)
class GenerationConfig:
    """How generation drives a decoder: the names of its ports, its end-of-sequence
    tokens, the default length, and how concurrent generations are batched (the
    ``generate`` key of a served model's ``config.json``).

    ``attention_mask`` and ``position_ids`` are inputs the loop fills (ones over the past
    and new positions, zeros over left padding; the positions of the new tokens); None
    leaves them out. Made with :meth:`for_model`, they default to the model's inputs of
    those names.

    With ``batching`` (the default), concurrent generations on one compiled model with
    one config run together, one batched inference per step, under the limits below
    (see :mod:`aioinfer.generation.scheduler`); a decoder without ``attention_mask`` or
    without a KV cache in the request generates one sequence per request instead.
    """

    input_ids: str = "input_ids"
    logits: str = "logits"
    attention_mask: str | None = None
    position_ids: str | None = None
    eos_token_id: tuple[int, ...] = ()
    """Tokens that end the generation (the token is yielded, then it stops)."""
    max_new_tokens: int = 64
    batching: bool = True
    """Whether concurrent generations share one batched step (the scheduler)."""
    max_running_sequences: int = 32
    """Sequences in the running batch at most (a paused one keeps its place)."""
    max_step_tokens: int = 2048
    """Tokens one step computes at most, decode and prefill together: a prompt longer
    than what is left after the running sequences' tokens is prefilled in chunks."""
    max_waiting_sequences: int = 1024
    """Sequences waiting for a place at most; one more raises ``QueueFullError``."""
    max_buffered_tokens: int = 16
    """Tokens generated ahead of a slow consumer; then its sequence pauses."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> GenerationConfig:
        """Check and convert a ``generate`` mapping (``eos_token_id``: an integer or a
        list of them; an absent ``attention_mask`` or ``position_ids``: see
        :meth:`for_model`).

        Raises:
            GenerationError: an unknown key or a value of the wrong type (named).
        """
        known = [f.name for f in fields(cls)]
        for key, value in values.items():
            if key not in known:
                raise GenerationError(
                    f"unknown generate key {key!r}; known keys: {', '.join(known)}"
                )
            if key in ("input_ids", "logits") and not isinstance(value, str):
                raise GenerationError(f"generate {key!r} must be a string, got {value!r}")
            if key in ("attention_mask", "position_ids") and not isinstance(
                value, (str, type(None))
            ):
                raise GenerationError(f"generate {key!r} must be a string or null, got {value!r}")
            if key == "batching" and not isinstance(value, bool):
                raise GenerationError(f"generate 'batching' must be true or false, got {value!r}")
        converted = dict(values)
        if "eos_token_id" in values:
            converted["eos_token_id"] = token_ids(values["eos_token_id"], "generate 'eos_token_id'")
        for key in ("max_new_tokens", *_LIMITS):
            if key in values:
                minimum = 0 if key == "max_waiting_sequences" else 1
                converted[key] = count(values[key], f"generate {key!r}", minimum)
        return cls(**converted)

    @classmethod
    def for_model(
        cls, compiled: CompiledModel, values: GenerationConfig | Mapping[str, Any] | None = None
    ) -> GenerationConfig:
        """The config of ``values`` (None: every default) checked against ``compiled``;
        ``attention_mask`` and ``position_ids`` default to the model's inputs of those
        names when ``values`` is a mapping that does not name them (or None).

        Raises:
            GenerationError: a named input or output that the model lacks, one of the
                wrong kind (``input_ids`` not integer, ``logits`` not rank 2 or 3), or an
                input of the model that the loop would not feed (the state of a model
                compiled without ``STATEFUL``).
        """
        if isinstance(values, GenerationConfig):
            config = values
        else:
            mapping = dict(values or {})
            names = {port.name for port in compiled.inputs}
            for key in ("attention_mask", "position_ids"):
                if key not in mapping and key in names:
                    mapping[key] = key
            config = cls.from_mapping(mapping)
        config.check(compiled)
        return config

    def check(self, compiled: CompiledModel) -> None:
        """Raise :class:`GenerationError` unless ``compiled`` has the ports named here
        (of the right kind) and no other input (see :meth:`for_model`)."""
        inputs = {port.name: port for port in compiled.inputs}
        outputs = {port.name: port for port in compiled.outputs}
        fed = {"input_ids": self.input_ids}
        fed.update({k: v for k, v in self.feeds().items() if v is not None})
        for key, name in fed.items():
            port = inputs.get(name)
            if port is None:
                raise GenerationError(
                    f"generate {key!r} names {name!r}, not an input of the model; its inputs: "
                    f"{_names(inputs)}"
                )
            if port.dtype.kind not in "iu":
                raise GenerationError(
                    f"generate {key!r}: input {name!r} must have an integer element type, "
                    f"has {port.dtype}"
                )
        logits = outputs.get(self.logits)
        if logits is None:
            raise GenerationError(
                f"generate 'logits' names {self.logits!r}, not an output of the model; its "
                f"outputs: {_names(outputs)}"
            )
        if logits.rank not in (None, 2, 3):
            raise GenerationError(
                f"generate 'logits': output {self.logits!r} must be [batch, sequence, vocab] "
                f"or [batch, vocab], has rank {logits.rank}"
            )
        unfed = [name for name in inputs if name not in fed.values()]
        if unfed:
            raise GenerationError(
                f"generation feeds {', '.join(map(repr, fed.values()))}, but the model also "
                f"has the input(s) {', '.join(map(repr, unfed))}: compile it with "
                'STATEFUL ("stateful": "auto" in a served model\'s config.json) so that '
                "its KV cache (or other state) is kept in the request"
            )

    def feeds(self) -> dict[str, str | None]:
        """The optional inputs the loop fills, by role."""
        return {"attention_mask": self.attention_mask, "position_ids": self.position_ids}


def token_ids(values: Any, what: str) -> tuple[int, ...]:
    """``values`` (a token id or an iterable of them) as a tuple of ints.

    Raises:
        GenerationError: not token ids (``what`` names the argument).
    """
    items = [values] if isinstance(values, (int, np.integer)) else values
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        items = [items]  # refused below, named
    items = list(items)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in items):
        raise GenerationError(
            f"{what} must be a token id or a list of them (integers at least 0), got {values!r}"
        )
    return tuple(int(v) for v in items)


def count(value: Any, what: str, minimum: int = 1) -> int:
    """``value`` as an int at least ``minimum``.

    Raises:
        GenerationError: not an integer, or below ``minimum`` (``what`` names it).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise GenerationError(f"{what} must be an integer at least {minimum}, got {value!r}")
    return int(value)


def _names(ports: Mapping[str, Port]) -> str:
    return ", ".join(map(repr, ports)) or "none"
