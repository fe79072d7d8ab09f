"""Token generation from a decoder whose KV cache is the request's variable state.

``aioinfer.generate(compiled, input_ids)`` is an async generator of token ids. Compiled
with ``STATEFUL`` (``"auto"`` pairs ``past_*`` inputs with ``present_*`` outputs), the
decoder keeps its cache in the infer request, so each step after the prompt feeds one
token: the loop only picks the next token from the logits (greedy, or sampled with a
seeded numpy Generator) and maintains ``attention_mask`` and ``position_ids`` when the
model has them. A model without variables gets the whole sequence at every step.

Nothing computes between steps: a step runs when the consumer asks for the next token.
So closing the generator (or leaving ``async with contextlib.aclosing(...)``) stops the
generation at once, and cancelling the consumer during a step cancels that step between
kernels; either way the request goes back to its pool, idle and usable. Each generation
runs on a request of its own, taken from a pool per compiled model of at most
``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` requests: more concurrent generations wait, in
arrival order, for one to finish.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import anyio
import numpy as np

from aioinfer.errors import GenerationError, InputShapeError, InputTypeError
from aioinfer.model import Port
from aioinfer.plugin.async_request import AsyncInferRequest, RequestState
from aioinfer.plugin.compiled_model import CompiledModel

FINISH_LENGTH = "length"
"""The finish reason of a generation that produced ``max_new_tokens`` tokens."""
FINISH_STOP = "stop"
"""The finish reason of a generation that produced an end-of-sequence or stop token."""


@dataclass(frozen=True)
class GenerationConfig:
    """How generation drives a decoder: the names of its ports, its end-of-sequence
    tokens and the default length (the ``generate`` key of a served model's
    ``config.json``).

    ``attention_mask`` and ``position_ids`` are inputs the loop fills (ones over the past
    and new positions; the positions of the new tokens); None leaves them out. Made with
    :meth:`for_model`, they default to the model's inputs of those names.
    """

    input_ids: str = "input_ids"
    logits: str = "logits"
    attention_mask: str | None = None
    position_ids: str | None = None
    eos_token_id: tuple[int, ...] = ()
    """Tokens that end the generation (the token is yielded, then it stops)."""
    max_new_tokens: int = 64

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
        converted = dict(values)
        if "eos_token_id" in values:
            converted["eos_token_id"] = _token_ids(
                values["eos_token_id"], "generate 'eos_token_id'"
            )
        if "max_new_tokens" in values:
            converted["max_new_tokens"] = _count(
                values["max_new_tokens"], "generate 'max_new_tokens'"
            )
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
                else _count(max_new_tokens, "max_new_tokens")
            ),
            temperature=float(temperature),
            top_k=0 if top_k is None else _count(top_k, "top_k", minimum=0),
            top_p=1.0 if top_p is None else float(top_p),
            seed=seed,
            stop=frozenset(config.eos_token_id) | frozenset(_token_ids(stop, "stop")),
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


async def generate(
    compiled: CompiledModel,
    input_ids: Iterable[int] | np.ndarray,
    *,
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Iterable[int] = (),
    config: GenerationConfig | Mapping[str, Any] | None = None,
    request: AsyncInferRequest | None = None,
) -> AsyncGenerator[int, None]:
    """Yield the tokens a decoder generates after the prompt ``input_ids``, one per step.

    ``compiled`` is a decoder compiled with ``STATEFUL`` (its KV cache in the request; a
    model without variables is fed the whole sequence at each step). ``config`` names its
    ports (default: ``input_ids`` in, ``logits`` out, ``attention_mask`` and
    ``position_ids`` when the model has them; see :class:`GenerationConfig`). The
    generation ends after ``max_new_tokens`` tokens (None: the config's, 64 by default),
    or after yielding an end-of-sequence token of the config or a token of ``stop``.
    ``temperature`` 0 is greedy; above 0, tokens are sampled (``top_k``, ``top_p``) with
    numpy's Generator seeded with ``seed``: the same seed gives the same tokens.

    The generation runs on ``request`` when given, else on a request of the compiled
    model's generation pool (at most ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``; more
    concurrent generations wait for one); its state is reset first. A step runs only when
    the next token is asked for: closing the generator stops the generation, cancelling
    the consumer cancels the running step; the request stays usable. Close the generator
    when leaving the loop early (``contextlib.aclosing``), or the request returns to the
    pool only when the generator is garbage-collected.

    Raises:
        GenerationError: a bad argument or config (named); the config does not fit the
            model (see :meth:`GenerationConfig.for_model`).
        InputTypeError, InputShapeError: ``input_ids`` are not integers, empty, not one
            sequence, or a token is out of the vocabulary.
        The errors of ``AsyncInferRequest.infer`` (a failed kernel: ``InferenceError``).
    """
    config = GenerationConfig.for_model(compiled, config)
    sampling = Sampling.of(config, max_new_tokens, temperature, top_k, top_p, seed, stop)
    prompt = prompt_ids(compiled, config, input_ids)
    pool: _RequestPool | None = None
    if request is None:
        pool = _pool_of(compiled)
        running = await pool.acquire()
    else:
        running = request
    try:
        # One generator, no inner one: closing this one must release the request now,
        # not when an abandoned inner generator is collected.
        ports = {port.name: port for port in running.inputs}
        ids_dtype = ports[config.input_ids].dtype
        mask, positions = config.attention_mask, config.position_ids
        rng = np.random.default_rng(sampling.seed)
        running.reset_state()
        stateful = bool(running.query_state())
        sequence, past = list(prompt), 0
        feed = sequence
        for produced in range(1, sampling.max_new_tokens + 1):
            total = past + len(feed)
            inputs = {config.input_ids: np.array([feed], ids_dtype)}
            if mask is not None:
                inputs[mask] = np.ones((1, total), ports[mask].dtype)
            if positions is not None:
                inputs[positions] = np.arange(past, total, dtype=ports[positions].dtype)[None]
            results = await running.infer(inputs, share_inputs=True)
            token = sampling.pick(_last_logits(results[config.logits], config.logits), rng)
            yield token
            if sampling.finish_reason(token, produced) is not None:
                return
            sequence.append(token)
            if stateful:
                past, feed = total, [token]
            else:
                feed = sequence
    finally:
        if running.state is RequestState.IDLE:
            running.clear_inputs()  # keeps no step's inputs alive
        if pool is not None:
            pool.release(running)


def prompt_ids(
    compiled: CompiledModel, config: GenerationConfig, input_ids: Iterable[int] | np.ndarray
) -> list[int]:
    """``input_ids`` as a list of token ids, checked: integers, one non-empty sequence
    (a ``[1, n]`` array too), each within the vocabulary when the logits' last dimension
    is static.

    Raises:
        InputTypeError: not integers.
        InputShapeError: empty, more than one sequence, or a token out of range.
    """
    name = config.input_ids
    ids = np.asarray(input_ids if isinstance(input_ids, np.ndarray) else list(input_ids))
    if ids.size and ids.dtype.kind not in "iu":
        raise InputTypeError(f"input {name!r}: token ids must be integers, got {ids.dtype} values")
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or ids.size == 0:
        raise InputShapeError(
            f"input {name!r}: expected one non-empty sequence of token ids, got shape "
            f"{list(ids.shape)}"
        )
    logits = compiled.output(config.logits)
    vocab = logits.shape[-1] if logits.shape else None
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (isinstance(vocab, int) and high >= vocab):
        bad = low if low < 0 else high
        size = f"[0, {vocab})" if isinstance(vocab, int) else "at least 0"
        raise InputShapeError(f"input {name!r}: token id {bad} is out of range {size}")
    return [int(i) for i in ids]


def _last_logits(logits: Any, name: str) -> np.ndarray:
    array = np.asarray(logits)
    if array.ndim == 3:
        return array[0, -1]
    if array.ndim == 2:
        return array[0]
    raise GenerationError(
        f"output {name!r} (the logits) has shape {list(array.shape)}; expected [batch, "
        "sequence, vocab] or [batch, vocab]"
    )


class _RequestPool:
    """At most ``size`` requests of one compiled model for generations; more wait in
    arrival order."""

    def __init__(self, compiled: CompiledModel, size: int) -> None:
        self.compiled = compiled
        self.free = size
        self.idle: list[AsyncInferRequest] = []
        self.waiters: deque[anyio.Event] = deque()

    async def acquire(self) -> AsyncInferRequest:
        """An idle request (a new one while fewer than ``size`` exist), waiting for one
        in arrival order when all are taken."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
        else:
            event = anyio.Event()  # made here: the pool may serve several event loops
            self.waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if event.is_set():  # handed a slot as we were cancelled: pass it on
                    self._release()
                else:
                    self.waiters.remove(event)
                raise
        try:
            return self.idle.pop() if self.idle else self.compiled.create_infer_request()
        except BaseException:
            self._release()
            raise

    def release(self, request: AsyncInferRequest) -> None:
        """Take back ``request`` (unless it was closed) and hand its slot on."""
        if request.state is not RequestState.CLOSED:
            self.idle.append(request)
        self._release()

    def _release(self) -> None:
        if self.waiters:
            self.waiters.popleft().set()
        else:
            self.free += 1


_pools: weakref.WeakKeyDictionary[CompiledModel, _RequestPool] = weakref.WeakKeyDictionary()


def _pool_of(compiled: CompiledModel) -> _RequestPool:
    pool = _pools.get(compiled)
    if pool is None:
        size = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        pool = _pools[compiled] = _RequestPool(compiled, max(1, size))
    return pool


def _token_ids(values: Any, what: str) -> tuple[int, ...]:
    items = [values] if isinstance(values, (int, np.integer)) else values
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        items = [items]  # refused below, named
    items = list(items)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in items):
        raise GenerationError(
            f"{what} must be a token id or a list of them (integers at least 0), got {values!r}"
        )
    return tuple(int(v) for v in items)


def _count(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise GenerationError(f"{what} must be an integer at least {minimum}, got {value!r}")
    return int(value)


def _names(ports: Mapping[str, Port]) -> str:
    return ", ".join(map(repr, ports)) or "none"
