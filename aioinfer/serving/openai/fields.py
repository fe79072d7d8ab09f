"""The fields of OpenAI's completion and chat completion requests, read and checked.

Every field of OpenAI's API is either taken (its meaning honoured), accepted because it
does not change the answer (``user``, ``metadata``, ``store``, ``service_tier``, a
field at its default value such as ``response_format: {"type": "text"}``), or refused
with a 400 that names it: a field that would change the meaning of the answer and that
aioinfer does not do (``tools``, ``response_format`` JSON, ``logit_bias``, ``suffix``,
``best_of`` above ``n``, audio, ...) is never silently ignored. vLLM's extras
``top_k``, ``ignore_eos``, ``stop_token_ids`` and ``skip_special_tokens`` are taken
too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aioinfer.errors import RequestFieldError

MAX_N = 16
"""Choices one request may ask for at most."""
MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on ``top_logprobs`` (chat); completions' ``logprobs`` is at most 5."""

_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "n",
        "stream",
        "stream_options",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "user",
        "top_k",
        "ignore_eos",
        "stop_token_ids",
        "skip_special_tokens",
    }
)
_HARMLESS = frozenset({"metadata", "store", "service_tier", "user"})
"""Fields that do not change the answer: accepted, not used."""
_AT_DEFAULT: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "min_tokens": (None, 0),
    "repetition_penalty": (None, 1, 1.0),
    "length_penalty": (None, 1, 1.0),
    "use_beam_search": (None, False),
}
"""Fields aioinfer does not do, accepted at these values only (their defaults: the
answer is the same as without them)."""
_COMPLETION_FIELDS = _COMMON | {"prompt", "echo"}
_CHAT_FIELDS = _COMMON | {"messages", "top_logprobs", "max_completion_tokens"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class TextRequest:
    """A completion or chat completion request, checked: its prompts (texts, token
    id lists, or one chat), the options of :meth:`TextGenerator.stream
    <aioinfer.text.TextGenerator.stream>`, and how to answer."""

    model: str
    prompts: list[str | list[int]] | None = None
    """The completion prompts (None for a chat)."""
    messages: list[dict[str, Any]] | None = None
    """The chat's messages (None for a completion)."""
    options: dict[str, Any] = field(default_factory=dict)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    """How many top alternatives each token reports (None: no log-probabilities)."""
    echo: bool = False


def invalid(message: str, param: str | None = None) -> RequestFieldError:
    """A 400: ``message``, naming ``param``."""
    return RequestFieldError(message, param)


def parse_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body.

    Raises:
        RequestFieldError:, not JSON or not an object.
    """
    try:
        values = json.loads(body)
    except ValueError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise invalid("the request body must be a JSON object")
    return values


def completion_request(values: Mapping[str, Any]) -> TextRequest:
    """A ``/v1/completions`` request.

    Raises:
        RequestFieldError: naming the field (see the module).
    """
    _check_fields(values, _COMPLETION_FIELDS)
    prompt = values.get("prompt")
    prompts: list[str | list[int]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(i) for i in prompt):
        prompts = [list(prompt)]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(_is_int(i) for i in p))
            for p in prompt
        )
    ):
        prompts = list(prompt)
    else:
        raise invalid(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of "
            f"lists of token ids (none empty), got {_show(prompt)}",
            "prompt",
        )
    logprobs = values.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= 5):
        raise invalid(f"'logprobs' must be an integer in [0, 5], got {_show(logprobs)}", "logprobs")
    echo = _flag(values, "echo")
    if echo and logprobs is not None:
        raise invalid(
            "'echo' with 'logprobs' (the prompt's log-probabilities) is not supported", "echo"
        )
    return _request(values, prompts=prompts, logprobs=logprobs, echo=echo)


def chat_request(values: Mapping[str, Any]) -> TextRequest:
    """A ``/v1/chat/completions`` request.

    Raises:
        RequestFieldError: naming the field (see the module).
    """
    _check_fields(values, _CHAT_FIELDS)
    messages = values.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid(f"'messages' must be a non-empty list, got {_show(messages)}", "messages")
    chat = [_message(message, index) for index, message in enumerate(messages)]
    top = values.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise invalid(
            f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {_show(top)}",
            "top_logprobs",
        )
    wanted = _flag(values, "logprobs")
    if top is not None and not wanted:
        raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if "max_completion_tokens" in values and values["max_completion_tokens"] is not None:
        values = {**values, "max_tokens": values["max_completion_tokens"]}
    return _request(values, messages=chat, logprobs=(top or 0) if wanted else None)


def _request(values: Mapping[str, Any], **parts: Any) -> TextRequest:
    model = values.get("model")
    if not isinstance(model, str) or not model:
        raise invalid(f"'model' must be a model's name, got {_show(model)}", "model")
    n = values.get("n", 1)
    if n is None:
        n = 1
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise invalid(f"'n' must be an integer in [1, {MAX_N}], got {_show(n)}", "n")
    stream = _flag(values, "stream")
    stream_options = values.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not isinstance(stream_options, dict) or set(stream_options) - {
            "include_usage",
            "continuous_usage_stats",
        }:
            raise invalid(
                "'stream_options' must be an object with 'include_usage', got "
                f"{_show(stream_options)}",
                "stream_options",
            )
        if not stream:
            raise invalid("'stream_options' is only allowed with 'stream': true", "stream_options")
        include_usage = _flag(stream_options, "include_usage", "stream_options.include_usage")
    stop = values.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = list(stop)
    else:
        raise invalid(
            f"'stop' must be a string or a list of at most 4 strings, got {_show(stop)}", "stop"
        )
    options: dict[str, Any] = {"stop": stops}
    for name, kind in (
        ("max_tokens", "count"),
        ("temperature", "number"),
        ("top_p", "number"),
        ("seed", "int"),
        ("presence_penalty", "number"),
        ("frequency_penalty", "number"),
        ("top_k", "int"),
        ("ignore_eos", "bool"),
        ("stop_token_ids", "ids"),
        ("skip_special_tokens", "bool"),
    ):
        value = values.get(name)
        if value is None:
            continue
        if kind == "count" and not (_is_int(value) and value >= 1):
            raise invalid(f"'{name}' must be an integer at least 1, got {_show(value)}", name)
        if kind == "number" and not (
            isinstance(value, (int, float)) and not isinstance(value, bool)
        ):
            raise invalid(f"'{name}' must be a number, got {_show(value)}", name)
        if kind == "int" and not _is_int(value):
            raise invalid(f"'{name}' must be an integer, got {_show(value)}", name)
        if kind == "bool" and not isinstance(value, bool):
            raise invalid(f"'{name}' must be true or false, got {_show(value)}", name)
        if kind == "ids" and not (isinstance(value, list) and all(_is_int(i) for i in value)):
            raise invalid(f"'{name}' must be a list of token ids, got {_show(value)}", name)
        options[name] = value
    if options.get("top_k") == -1:  # vLLM's "all tokens"
        options["top_k"] = 0
    return TextRequest(
        model=model, n=n, stream=stream, include_usage=include_usage, options=options, **parts
    )


def _check_fields(values: Mapping[str, Any], taken: frozenset[str]) -> None:
    for name in sorted(values):
        if name in taken or name in _HARMLESS:
            continue
        if name in _AT_DEFAULT:
            if values[name] in _AT_DEFAULT[name]:
                continue
            raise invalid(
                f"'{name}' is not supported by this server (got {_show(values[name])}); "
                "leave it out",
                name,
            )
        raise invalid(f"unknown field '{name}'", name)


def _message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"'{where}' must be an object, got {_show(message)}", where)
    role = message.get("role")
    if role not in _ROLES:
        raise invalid(
            f"'{where}.role' must be one of {', '.join(_ROLES)}, got {_show(role)} (tool "
            "calls are not supported)",
            f"{where}.role",
        )
    for name in message:
        if name not in ("role", "content", "name"):
            raise invalid(f"'{where}.{name}' is not supported", f"{where}.{name}")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for number, part in enumerate(content):
            here = f"{where}.content[{number}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else part
                raise invalid(
                    f"'{here}' must be a text part (type 'text'), got {_show(kind)}", here
                )
            if not isinstance(part.get("text"), str):
                raise invalid(f"'{here}.text' must be a string", f"{here}.text")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise invalid(
            f"'{where}.content' must be a string or a list of text parts, got {_show(content)}",
            f"{where}.content",
        )
    chat = {"role": _ROLES[role], "content": content}
    if isinstance(message.get("name"), str):
        chat["name"] = message["name"]
    return chat


def _flag(values: Mapping[str, Any], name: str, where: str | None = None) -> bool:
    value = values.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{where or name}' must be true or false, got {_show(value)}", where or name)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
