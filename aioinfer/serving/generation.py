"""Generation in the model service, whatever the transport.

A model whose config has a ``generate`` key (a
:class:`~aioinfer.generation.GenerationConfig`; the model is a decoder compiled with
``"stateful"``) generates tokens for :meth:`InferenceService.generate
<aioinfer.serving.service.InferenceService.generate>`: an async generator of
:class:`GeneratedToken`, the last one with its ``finish_reason``. A transport iterates
it and translates each token (REST: JSON or server-sent events; gRPC: a stream
response each); errors are :class:`~aioinfer.errors.ServiceError` with a kind, raised by
the iteration that meets them. So a transport knows whether an error came before the
first token (it can still answer with an error status) or after.

A generation is one request of the model's statistics, in flight (the drain waits for
it) until it ends, and holds one of the model's ``max_concurrency`` slots, shared with
its inferences, while it runs: more wait in the model's queue, and beyond it are refused
(UNAVAILABLE). It runs in the model's generation scheduler, batched with the model's
other generations (see :mod:`aioinfer.generation.scheduler`; the ``generate`` key sets
its limits); a transport that stops iterating (a client that went away) takes its
sequence out before the next step.

With a ``tokenizer.json`` beside the model (the ``tokenizers`` package), a request may
give ``text_input`` instead of token ids, and each token carries the text it adds.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aioinfer.errors import (
    AioinferError,
    ErrorKind,
    GenerationError,
    RepositoryError,
    ServiceError,
)
from aioinfer.generation import GenerationConfig, Sampling, generate, prompt_ids
from aioinfer.serving.models import ServedModel
from aioinfer.text.chat_template import ChatTemplate
from aioinfer.text.generator import GenerationDefaults, TextGenerator, context_length
from aioinfer.text.tokenizer import read_library_tokenizer

_logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"

PARAMETERS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop")
"""The parameters a generate request may give (see :func:`aioinfer.generate`)."""


@dataclass(frozen=True)
class GenerateRequest:
    """One decoded generate request: the prompt as token ids or as text (exactly one),
    and its :data:`PARAMETERS`."""

    input_ids: Sequence[int] | None = None
    text_input: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GeneratedToken:
    """One token of a generation."""

    model_name: str
    model_version: str
    token_id: int
    index: int
    """The token's position among the generated tokens, from 0."""
    text: str | None = None
    """The text this token adds (with a tokenizer; else None)."""
    finish_reason: str | None = None
    """On the last token: ``"stop"`` (an end-of-sequence or stop token) or ``"length"``
    (``max_new_tokens`` reached)."""


class ModelGeneration:
    """Generation for one served model version: its config (checked against the compiled
    model), its tokenizer, the requests its generations run on.

    Raises:
        RepositoryError: the config does not fit the model (the message names the model,
            the key and the ports), or the tokenizer cannot be read.
    """

    def __init__(self, model: ServedModel, tokenizer_path: Path | None = None) -> None:
        self.model = model
        where = f"model {model.name!r} version {model.version}: config 'generate'"
        try:
            self.config = GenerationConfig.for_model(model.compiled, model.config.generate)
        except GenerationError as exc:
            raise RepositoryError(f"{where}: {exc}") from None
        self.tokenizer = (
            None
            if tokenizer_path is None
            else read_library_tokenizer(tokenizer_path, RepositoryError)
        )
        self.steps = 0
        """Tokens generated so far (one inference each): the work generations did."""
        self.text: TextGenerator | None = None
        """Text in and out (OpenAI's API): with a tokenizer, the chat template and the
        defaults of the folder that holds it."""
        if tokenizer_path is not None:
            folder = tokenizer_path.parent
            try:
                self.text = TextGenerator(
                    model.compiled,
                    self.tokenizer,
                    config=self.config,
                    chat_template=ChatTemplate.from_folder(folder),
                    defaults=GenerationDefaults.from_folder(folder),
                    max_context=context_length(folder),
                )
            except AioinferError as exc:  # a broken template or config file
                raise RepositoryError(f"model {model.name!r}: {exc}") from None

    @classmethod
    def beside(cls, model: ServedModel, model_path: Path) -> ModelGeneration:
        """The generation of ``model`` (read from ``model_path``), with the
        ``tokenizer.json`` beside the file or beside its version directory, if any."""
        candidates = (model_path.parent / TOKENIZER_FILE, model_path.parent.parent / TOKENIZER_FILE)
        return cls(model, next((path for path in candidates if path.is_file()), None))

    def prepare(self, request: GenerateRequest) -> tuple[list[int], dict[str, Any], Sampling]:
        """The prompt's token ids, the keyword arguments of :func:`aioinfer.generate` and
        the sampling settings of ``request``.

        Raises:
            ServiceError: INVALID_ARGUMENT, naming the problem: an unknown parameter or a
                bad value, no prompt or two, text without a tokenizer, bad token ids.
        """
        unknown = sorted(set(request.parameters) - set(PARAMETERS))
        if unknown:
            raise _invalid(
                f"unknown generate parameter(s) {', '.join(map(repr, unknown))}; known: "
                f"{', '.join(PARAMETERS)}"
            )
        if (request.input_ids is None) == (request.text_input is None):
            raise _invalid("a generate request gives either 'input_ids' or 'text_input'")
        options = dict(request.parameters)
        try:
            sampling = Sampling.of(self.config, **options)
            if request.text_input is not None:
                if self.tokenizer is None:
                    raise _invalid(
                        f"model {self.model.name!r} has no {TOKENIZER_FILE}: give 'input_ids'"
                    )
                ids: Sequence[int] = self.tokenizer.encode(request.text_input).ids
            else:
                ids = request.input_ids or []
            prompt = prompt_ids(self.model.compiled, self.config, ids)
        except ServiceError:
            raise
        except AioinferError as exc:  # GenerationError, InputError
            raise _invalid(str(exc)) from None
        return prompt, options, sampling

    async def tokens(
        self, request: GenerateRequest, waited: list[float]
    ) -> AsyncGenerator[GeneratedToken, None]:
        """The tokens of ``request``; ``waited`` gets the seconds it waited for a slot.

        Raises:
            ServiceError: INVALID_ARGUMENT (see :meth:`prepare`; a kernel that failed on
                the prompt or a later step); UNAVAILABLE when the model's queue is full;
                ABORTED when the model was closed under it; INTERNAL for a fault of the
                server (logged).
        """
        prompt, options, sampling = self.prepare(request)
        model = self.model
        async with model.slot() as seconds:
            waited.append(seconds)
            steps = generate(model.compiled, prompt, config=self.config, **options)
            generated: list[int] = []
            text = ""
            async with aclosing(steps):
                while True:
                    token = await self._next(steps)
                    if token is None:
                        return
                    self.steps += 1
                    generated.append(token)
                    added = None
                    if self.tokenizer is not None:
                        full = self.tokenizer.decode(generated)
                        added = full[len(text) :] if full.startswith(text) else full
                        text = full
                    yield GeneratedToken(
                        model.name,
                        model.version,
                        token,
                        len(generated) - 1,
                        added,
                        sampling.finish_reason(token, len(generated)),
                    )

    def decode(self, token_ids: Sequence[int]) -> str | None:
        """The text of ``token_ids`` (None without a tokenizer)."""
        return None if self.tokenizer is None else self.tokenizer.decode(list(token_ids))

    async def _next(self, steps: AsyncGenerator[int, None]) -> int | None:
        """The next token of ``steps`` (None at its end), its errors as ServiceErrors."""
        try:
            return await anext(steps)
        except StopAsyncIteration:
            return None
        except ServiceError:
            raise
        except AioinferError as exc:
            raise ServiceError(str(exc), ErrorKind.of(exc)) from exc
        except Exception as exc:
            model = self.model
            _logger.exception("generation of model %r version %s", model.name, model.version)
            raise ServiceError(
                f"internal server error: {type(exc).__name__}: {exc}", ErrorKind.INTERNAL
            ) from exc


class GenerationCall(Protocol):
    """What a generation reads and sets of its call (the service's ``InferCall``)."""

    @property
    def model(self) -> ServedModel:
        """The model the request goes to."""

    waited: float
    """Seconds the generation waited for its steps."""


class GeneratingService(Protocol):
    """What a generation asks of the service (``InferenceService``): the call that
    counts it, and the generation of each model that generates."""

    @property
    def generations(self) -> Mapping[ServedModel, ModelGeneration]:
        """The generation of each served model whose config has ``generate``."""

    def call(self, name: str, version: str | None) -> AbstractAsyncContextManager[GenerationCall]:
        """One request to model ``name`` at ``version``, admitted and counted."""


async def generate_tokens(
    service: GeneratingService, name: str, version: str | None, request: GenerateRequest
) -> AsyncGenerator[GeneratedToken, None]:
    """:meth:`InferenceService.generate <aioinfer.serving.service.InferenceService.
    generate>`: the generation, counted in the model's statistics and in flight until it
    ends."""
    async with service.call(name, version) as call:
        generation = service.generations.get(call.model)
        if generation is None:
            raise _invalid(
                f"model {name!r} does not generate: its config.json has no 'generate' key"
            )
        waited: list[float] = []
        async with aclosing(generation.tokens(request, waited)) as tokens:
            async for token in tokens:
                yield token
        call.waited = sum(waited)


def _invalid(message: str) -> ServiceError:
    return ServiceError(message, ErrorKind.INVALID_ARGUMENT)
