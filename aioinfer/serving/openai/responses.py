"""The JSON of OpenAI's answers: completions, chat completions, their stream chunks,
log-probabilities and usage, field for field as OpenAI's service writes them."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aioinfer.generation.sampling import Step
from aioinfer.text.generator import TextGenerator


@dataclass
class Choice:
    """What one choice has produced so far."""

    index: int
    texts: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    finish_reason: str | None = None
    started: bool = False
    """Whether its first stream chunk (the chat's role) was sent."""

    @property
    def text(self) -> str:
        """Its whole text."""
        return "".join(self.texts)


class Answer:
    """The frame of one request's answers: its id, creation time, model and kind."""

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model
        self.object = "chat.completion" if chat else "text_completion"

    def head(self, chunk: bool = False) -> dict[str, Any]:
        """``id``, ``object``, ``created``, ``model`` (of a stream chunk with ``chunk``)."""
        kind = "chat.completion.chunk" if self.chat and chunk else self.object
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def whole(
        self,
        choices: Sequence[Choice],
        usage: dict[str, int],
        logprobs: bool,
        generator: TextGenerator,
    ) -> dict[str, Any]:
        """The answer of a request that does not stream."""
        rendered = []
        for choice in choices:
            item: dict[str, Any] = {"index": choice.index}
            if self.chat:
                item["message"] = {"role": "assistant", "content": choice.text}
                item["logprobs"] = chat_logprobs(generator, choice.steps) if logprobs else None
            else:
                item["text"] = choice.text
                item["logprobs"] = (
                    completion_logprobs(generator, choice.steps, 0) if logprobs else None
                )
            item["finish_reason"] = choice.finish_reason
            rendered.append(item)
        return {**self.head(), "choices": rendered, "usage": usage}

    def chunk(
        self,
        index: int,
        *,
        text: str | None = None,
        role: bool = False,
        logprobs: Any = None,
        finish_reason: str | None = None,
        usage: bool = False,
    ) -> dict[str, Any]:
        """One stream chunk for choice ``index``; ``usage`` adds ``"usage": null`` (the
        client asked for usage: every chunk but the last carries it empty)."""
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        body = {**self.head(chunk=True), "choices": [choice]}
        if usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        """The last chunk of a stream whose client asked for usage: no choices."""
        return {**self.head(chunk=True), "choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_logprobs(generator: TextGenerator, steps: Sequence[Step]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``{"content": [{token, logprob, bytes,
    top_logprobs}]}``."""
    content = []
    for step in steps:
        entry = _token_entry(generator, step.token, step.logprob)
        entry["top_logprobs"] = [_token_entry(generator, t, lp) for t, lp in step.top_logprobs]
        content.append(entry)
    return {"content": content}


def completion_logprobs(
    generator: TextGenerator, steps: Sequence[Step], offset: int
) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (the legacy shape): ``tokens``,
    ``token_logprobs``, ``top_logprobs`` (token text -> log-probability) and
    ``text_offset`` (from ``offset``, the text before them)."""
    tokens, offsets = [], []
    for step in steps:
        text = token_text(generator, step.token)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
    return {
        "tokens": tokens,
        "token_logprobs": [step.logprob for step in steps],
        "top_logprobs": [
            {token_text(generator, t): lp for t, lp in step.top_logprobs} for step in steps
        ],
        "text_offset": offsets,
    }


def token_text(generator: TextGenerator, token: int) -> str:
    """The text of one token (its special token's text too)."""
    return generator.decode([token], skip_special_tokens=False)


def _token_entry(generator: TextGenerator, token: int, logprob: float | None) -> dict[str, Any]:
    text = token_text(generator, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
