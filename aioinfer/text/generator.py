"""Text in, text out: a decoder, its tokenizer and its chat template together.

:class:`TextGenerator` turns a prompt (text, token ids, or chat messages through the
model's template) into chunks of text as the decoder generates them, each with its
tokens (and their log-probabilities when asked) and, on the last one, why it ended. The
tokens come from :func:`aioinfer.generation.generate_steps`, so every text generation on
one compiled model shares its scheduler with the others. Text is decoded incrementally
(:mod:`.detokenize`): a chunk never ends inside a UTF-8 character, and stop strings are
matched on the text and cut out. A stop string found ends the generation: its sequence
leaves the batch before the next step.

``aioinfer.generate_text(compiled, folder, prompt)`` is the same for a folder as an
exporter wrote it.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread

from aioinfer.errors import ChatTemplateError, ModelFolderError, TextGenerationError
from aioinfer.generation.api import generate_steps
from aioinfer.generation.config import GenerationConfig, token_ids
from aioinfer.generation.sampling import FINISH_STOP, Step
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.text.chat_template import ChatTemplate
from aioinfer.text.detokenize import IncrementalDetokenizer, StopStrings
from aioinfer.text.tokenizer import TOKENIZER_FILE, read_json_object, read_library_tokenizer

GENERATION_CONFIG_FILE = "generation_config.json"

Message = Mapping[str, Any]
"""A chat message: ``{"role": ..., "content": ...}``."""


@dataclass(frozen=True)
class TextChunk:
    """What one step (or a few) of a generation added: ``text`` (possibly empty while a
    character or a possible stop string is incomplete), the generated ``steps`` it came
    from (token ids; log-probabilities when asked), and on the last chunk its
    ``finish_reason``: ``"stop"`` (an end-of-sequence token, a stop token or a stop
    string) or ``"length"`` (``max_tokens`` reached)."""

    text: str
    steps: tuple[Step, ...] = ()
    finish_reason: str | None = None

    @property
    def token_ids(self) -> list[int]:
        """The ids of the tokens of :attr:`steps`."""
        return [step.token for step in self.steps]


@dataclass(frozen=True)
class GenerationDefaults:
    """A model's own defaults, from its ``generation_config.json``: end-of-sequence
    tokens, length, and sampling (temperature, top_p, top_k only when it samples:
    transformers ignores them when ``do_sample`` is false, so greedy is then the
    default and ``temperature`` is 0)."""

    eos_token_id: tuple[int, ...] = ()
    max_new_tokens: int | None = None
    sampling: Mapping[str, Any] | None = None
    """``temperature``/``top_p``/``top_k`` it gives; None when it does not say whether
    it samples."""

    def config_values(self) -> dict[str, Any]:
        """The keys of a :class:`GenerationConfig` these defaults give
        (``eos_token_id``, ``max_new_tokens``), for a config to start from."""
        values: dict[str, Any] = {}
        if self.eos_token_id:
            values["eos_token_id"] = list(self.eos_token_id)
        if self.max_new_tokens is not None:
            values["max_new_tokens"] = self.max_new_tokens
        return values

    @classmethod
    def from_folder(cls, folder: str | Path) -> GenerationDefaults:
        """The defaults of ``folder``'s ``generation_config.json`` (none without one).

        Raises:
            ModelFolderError: the file is not a JSON object.
        """
        values = read_json_object(Path(folder) / GENERATION_CONFIG_FILE)
        eos = values.get("eos_token_id")
        try:
            eos_ids = () if eos is None else token_ids(eos, "eos_token_id")
        except ValueError:
            eos_ids = ()
        length = values.get("max_new_tokens")
        sampling: dict[str, Any] | None = None
        if values.get("do_sample") is True:
            sampling = {
                key: values[key] for key in ("temperature", "top_p", "top_k") if key in values
            }
            sampling.setdefault("temperature", 1.0)
        elif values.get("do_sample") is False:
            sampling = {"temperature": 0.0}
        return cls(
            eos_ids,
            length if isinstance(length, int) and length > 0 else None,
            sampling,
        )


class TextGenerator:
    """Text generation over a compiled decoder (``STATEFUL``) and its tokenizer.

    ``tokenizer`` is a ``tokenizers.Tokenizer``; ``config`` the decoder's
    :class:`GenerationConfig` (its end-of-sequence tokens and default length);
    ``chat_template`` renders chat messages (None: :meth:`render_chat` refuses).
    """

    def __init__(
        self,
        compiled: CompiledModel,
        tokenizer: Any,
        *,
        config: GenerationConfig | Mapping[str, Any] | None = None,
        chat_template: ChatTemplate | None = None,
        defaults: GenerationDefaults | None = None,
        max_context: int | None = None,
    ) -> None:
        self.compiled = compiled
        self.tokenizer = tokenizer
        self.config = GenerationConfig.for_model(compiled, config)
        self.chat_template = chat_template
        self.defaults = defaults or GenerationDefaults()
        self.max_context = max_context
        """The most tokens a sequence may hold, prompt and generated (the model's
        ``max_position_embeddings``); None: not known, not checked."""

    @classmethod
    def from_folder(
        cls,
        compiled: CompiledModel,
        folder: str | Path,
        config: Mapping[str, Any] | None = None,
    ) -> TextGenerator:
        """The generator of a decoder exported to ``folder`` (its ``tokenizer.json``,
        chat template and ``generation_config.json``); ``config`` overrides the keys of
        the :class:`GenerationConfig` (``eos_token_id`` and ``max_new_tokens`` default to
        the folder's). Reads files: call it off the event loop.

        Raises:
            ModelFolderError: no readable ``tokenizer.json``, a config file that is not
                a JSON object.
            GenerationError: ``config`` does not fit the model.
        """
        folder = Path(folder)
        tokenizer = read_library_tokenizer(folder / TOKENIZER_FILE)
        defaults = GenerationDefaults.from_folder(folder)
        values = {**defaults.config_values(), **(config or {})}
        return cls(
            compiled,
            tokenizer,
            config=values,
            chat_template=ChatTemplate.from_folder(folder),
            defaults=defaults,
            max_context=context_length(folder),
        )

    def render_chat(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt of chat ``messages`` through the model's template.

        Raises:
            ChatTemplateError: the model has no chat template, or it refused the messages.
        """
        if self.chat_template is None:
            raise ChatTemplateError(
                "the model has no chat template (no chat_template.jinja, no chat_template "
                "in tokenizer_config.json): give a prompt instead of messages"
            )
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``, on a worker thread (a long text takes a while).
        A chat prompt is encoded without special tokens: its template wrote them."""
        if not isinstance(text, str):
            raise TextGenerationError(f"a prompt must be a string, got {type(text).__name__}")
        encoding = await anyio.to_thread.run_sync(
            lambda: self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        )
        return list(encoding.ids)

    async def prompt_ids(self, prompt: str | Sequence[int] | Sequence[Message]) -> list[int]:
        """``prompt`` as token ids: text (with the tokenizer's special tokens), token ids
        as they are, or chat messages (rendered, then encoded)."""
        if isinstance(prompt, str):
            return await self.encode(prompt)
        items = list(prompt)
        if items and all(isinstance(item, Mapping) for item in items):
            text = self.render_chat(items)  # type: ignore[arg-type]
            return await self.encode(text, add_special_tokens=False)
        return list(token_ids(items, "prompt"))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` decoded at once."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    async def stream(
        self,
        prompt: str | Sequence[int] | Sequence[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: str | Iterable[str] = (),
        stop_token_ids: Iterable[int] = (),
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logprobs: int | None = None,
        ignore_eos: bool = False,
        skip_special_tokens: bool = True,
    ) -> AsyncGenerator[TextChunk, None]:
        """Yield the text of the generation after ``prompt`` (see :meth:`prompt_ids`) in
        chunks, one per generated token at most; the last chunk has the finish reason.

        ``max_tokens`` None is the config's length; ``temperature``, ``top_p`` and
        ``top_k`` None are the model's defaults (its ``generation_config.json``), else
        greedy. ``stop`` strings end the text before them; ``stop_token_ids`` end it
        after that token. The other arguments are those of
        :func:`~aioinfer.generation.generate_steps`. Closing the generator takes the
        sequence out of its batch before the next step.

        Raises:
            TextGenerationError: a stop that is not a string.
            ChatTemplateError: messages without a template, or refused by it.
            The errors of :func:`~aioinfer.generation.generate_steps`.
        """
        stops = [stop] if isinstance(stop, str) else list(stop)
        for value in stops:
            if not isinstance(value, str):
                raise TextGenerationError(
                    f"stop must be a string or a list of strings, got {value!r}"
                )
        ids = await self.prompt_ids(prompt)
        max_tokens = self._fit_context(len(ids), max_tokens)
        sampling = dict(self.defaults.sampling or {})
        steps = generate_steps(
            self.compiled,
            ids,
            max_new_tokens=max_tokens,
            temperature=temperature
            if temperature is not None
            else sampling.get("temperature", 0.0),
            top_p=top_p if top_p is not None else sampling.get("top_p"),
            top_k=top_k if top_k is not None else sampling.get("top_k"),
            seed=seed,
            stop=stop_token_ids,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            logprobs=logprobs,
            ignore_eos=ignore_eos,
            config=self.config,
        )
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, ids, skip_special_tokens=skip_special_tokens
        )
        stop_strings = StopStrings(stops)
        limit = self.config.max_new_tokens if max_tokens is None else max_tokens
        eos = frozenset(() if ignore_eos else self.config.eos_token_id) | frozenset(
            token_ids(stop_token_ids, "stop_token_ids")
        )
        produced = 0
        async with aclosing(steps):
            async for step in steps:
                produced += 1
                text = stop_strings.feed(detokenizer.push(step.token))
                if stop_strings.matched is not None:
                    yield TextChunk(text, (step,), FINISH_STOP)
                    return
                reason = None
                if step.token in eos:
                    reason = FINISH_STOP
                elif produced >= limit:
                    reason = "length"
                if reason is not None:
                    text += stop_strings.feed(detokenizer.flush())
                    if stop_strings.matched is not None:
                        reason = FINISH_STOP
                    else:
                        text += stop_strings.flush()
                    yield TextChunk(text, (step,), reason)
                    return
                yield TextChunk(text, (step,))
        # The steps ended on a rule of the config's own (a stop token it names): the text
        # held back ends the generation.
        text = stop_strings.feed(detokenizer.flush())
        yield TextChunk(
            text if stop_strings.matched else text + stop_strings.flush(), (), FINISH_STOP
        )

    def _fit_context(self, prompt: int, max_tokens: int | None) -> int | None:
        """``max_tokens`` within the model's context: as asked when it fits, the room
        left when none was asked and the config's length would pass the context.

        Raises:
            TextGenerationError: the prompt fills the context, or the prompt and
                ``max_tokens`` pass it (both lengths named).
        """
        context = self.max_context
        if context is None:
            return max_tokens
        if prompt >= context:
            raise TextGenerationError(
                f"this model's maximum context length is {context} tokens; the prompt "
                f"has {prompt}, leaving no room to generate"
            )
        if max_tokens is None:
            return min(self.config.max_new_tokens, context - prompt)
        if prompt + max_tokens > context:
            raise TextGenerationError(
                f"this model's maximum context length is {context} tokens; {prompt} in "
                f"the prompt and {max_tokens} asked for (max_tokens) pass it"
            )
        return max_tokens

    async def complete(
        self, prompt: str | Sequence[int] | Sequence[Message], **options: Any
    ) -> TextChunk:
        """The whole text of one generation (:meth:`stream`'s chunks joined): its text,
        every step, and the finish reason."""
        texts: list[str] = []
        steps: list[Step] = []
        reason = None
        async with aclosing(self.stream(prompt, **options)) as chunks:
            async for chunk in chunks:
                texts.append(chunk.text)
                steps.extend(chunk.steps)
                reason = chunk.finish_reason
        return TextChunk("".join(texts), tuple(steps), reason)


_generators: weakref.WeakKeyDictionary[CompiledModel, dict[Path, TextGenerator]] = (
    weakref.WeakKeyDictionary()
)


async def generate_text(
    compiled: CompiledModel,
    folder: str | Path,
    prompt: str | Sequence[int] | Sequence[Message],
    **options: Any,
) -> AsyncGenerator[TextChunk, None]:
    """Yield the text a decoder generates after ``prompt`` (text, token ids, or chat
    messages), in chunks: :meth:`TextGenerator.stream` with the tokenizer, chat template
    and defaults of the exporter's ``folder`` (read once per compiled model, off the
    event loop). ``options`` are :meth:`TextGenerator.stream`'s.

    Raises:
        The errors of :meth:`TextGenerator.from_folder` and :meth:`TextGenerator.stream`.
    """
    path = Path(folder).resolve()
    known = _generators.setdefault(compiled, {})
    generator = known.get(path)
    if generator is None:
        generator = await anyio.to_thread.run_sync(TextGenerator.from_folder, compiled, path)
        known[path] = generator
    async with aclosing(generator.stream(prompt, **options)) as chunks:
        async for chunk in chunks:
            yield chunk


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The keys of a Hugging Face ``config.json`` that give a model's context length, in the
order they are read."""


def context_length(folder: str | Path) -> int | None:
    """The context length of the model exported to ``folder`` (its ``config.json``'s
    :data:`CONTEXT_KEYS`), or None when it does not say."""
    try:
        values = read_json_object(Path(folder) / "config.json")
    except ModelFolderError:
        return None
    for key in CONTEXT_KEYS:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
