"""``aioinfer.generate``: the tokens of one generation, batched with the others."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from contextlib import aclosing
from typing import Any

import numpy as np

from aioinfer.errors import InputShapeError, InputTypeError
from aioinfer.generation.config import GenerationConfig
from aioinfer.generation.sampling import Sampling, Step
from aioinfer.generation.scheduler import scheduler_of
from aioinfer.generation.single import generate_alone
from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.compiled_model import CompiledModel


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
    ``position_ids`` when the model has them) and the scheduler's limits (see
    :class:`GenerationConfig`). The generation ends after ``max_new_tokens`` tokens (None:
    the config's, 64 by default), or after yielding an end-of-sequence token of the config
    or a token of ``stop``. ``temperature`` 0 is greedy; above 0, tokens are sampled
    (``top_k``, ``top_p``) with a numpy Generator of its own seeded with ``seed``: the same
    seed gives the same tokens, whatever else runs beside it.

    Concurrent generations on one compiled model share its scheduler (see
    :mod:`aioinfer.generation.scheduler`): each step is one batched inference for all of
    them; a generation waits in arrival order for a place (``max_running_sequences``), or
    fails with ``QueueFullError`` when too many wait. Tokens are generated ahead of the
    consumer up to ``max_buffered_tokens``. Closing the generator (``contextlib.aclosing``)
    or cancelling the consumer takes the sequence out before the next step.

    With ``request``, the generation runs alone on that request (state reset first), one
    step when the next token is asked for; closing the generator stops it, cancelling the
    consumer cancels the running step, and the request stays usable. A decoder the
    scheduler cannot batch (no ``attention_mask``, no cache in the request) or a config
    with ``batching`` off runs so too, on a request of a pool of at most
    ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` per compiled model.

    Raises:
        GenerationError: a bad argument or config (named); the config does not fit the
            model (see :meth:`GenerationConfig.for_model`).
        InputTypeError, InputShapeError: ``input_ids`` are not integers, empty, not one
            sequence, or a token is out of the vocabulary.
        QueueFullError: the scheduler's waiting queue is full (nothing started: retry).
        The errors of ``AsyncInferRequest.infer`` (a failed kernel: ``InferenceError``).
    """
    steps = generate_steps(
        compiled,
        input_ids,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=stop,
        config=config,
        request=request,
    )
    async with aclosing(steps):
        async for step in steps:
            yield step.token


async def generate_steps(
    compiled: CompiledModel,
    input_ids: Iterable[int] | np.ndarray,
    *,
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Iterable[int] = (),
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    logprobs: int | None = None,
    ignore_eos: bool = False,
    config: GenerationConfig | Mapping[str, Any] | None = None,
    request: AsyncInferRequest | None = None,
) -> AsyncGenerator[Step, None]:
    """:func:`generate` with more choice and more to tell: yield a :class:`Step` per
    token (the token; with ``logprobs``, its log-probability and the ``logprobs`` most
    likely tokens of the step).

    ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]) lower the
    logits of the tokens generated so far; ``ignore_eos`` generates past the config's
    end-of-sequence tokens (``stop`` tokens still end it). The other arguments, the
    scheduling and the errors are :func:`generate`'s (see
    :class:`~aioinfer.generation.sampling.Sampling`).
    """
    config = GenerationConfig.for_model(compiled, config)
    sampling = Sampling.of(
        config,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stop,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        logprobs=logprobs,
        ignore_eos=ignore_eos,
    )
    prompt = prompt_ids(compiled, config, input_ids)
    scheduler = None if request is not None else scheduler_of(compiled, config)
    if scheduler is None or not scheduler.serves_here():
        async with aclosing(generate_alone(compiled, config, sampling, prompt, request)) as alone:
            async for alone_step in alone:
                yield alone_step
        return
    sequence = scheduler.submit(prompt, sampling)
    try:
        while (step := await sequence.next()) is not None:
            yield step
    finally:
        scheduler.withdraw(sequence)


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
