"""A model's chat template, rendered as transformers renders it.

A model folder carries its chat template as ``chat_template.jinja`` (transformers 4.43
and later) or as the ``chat_template`` key of ``tokenizer_config.json`` (a string, or a
list of ``{"name", "template"}`` of which ``default`` is the one). The template is Jinja
run in a sandbox (a template is data from the model's author, not code to trust) with
transformers' settings, so that the prompt is the one the model was trained on:
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, the globals
``raise_exception`` and ``strftime_now``, a ``tojson`` filter that does not escape HTML
(``<`` stays ``<``), the special tokens (``bos_token``, ``eos_token``, ...) as variables,
and ``add_generation_prompt``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from aioinfer.errors import ChatTemplateError, ModelFolderError
from aioinfer.text.tokenizer import _token_text, read_json_object

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
_SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


class ChatTemplate:
    """A compiled chat template and the special tokens it sees as variables."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        """Compile ``source`` (Jinja) in a sandbox with transformers' settings;
        ``special_tokens`` maps variable names (``"bos_token"``) to token texts.

        Raises:
            ChatTemplateError: the template is not valid Jinja (the parser's message).
            ModelFolderError: the ``jinja2`` package is missing.
        """
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise ModelFolderError(
                "rendering a chat template needs the jinja2 package (pip install 'aioinfer[serve]')"
            ) from exc
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"the chat template is not valid Jinja: {exc} (line {exc.lineno})"
            ) from None
        self._errors: tuple[type[BaseException], ...] = (jinja2.TemplateError,)
        self.source = source
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTemplate | None:
        """The chat template of ``folder`` (``chat_template.jinja``, else the
        ``chat_template`` of ``tokenizer_config.json``) with the special tokens of its
        ``special_tokens_map.json`` and ``tokenizer_config.json``; None when it has none.

        Raises:
            ModelFolderError: a config file that is not a JSON object.
            ChatTemplateError: the template is not valid Jinja.
        """
        folder = Path(folder)
        config = read_json_object(folder / TOKENIZER_CONFIG_FILE)
        specials: dict[str, str] = {}
        for source in (read_json_object(folder / SPECIAL_TOKENS_FILE), config):
            for name in _SPECIAL_NAMES:
                text = _token_text(source.get(f"{name}_token"))
                if text is not None:
                    specials[f"{name}_token"] = text
        file = folder / TEMPLATE_FILE
        if file.is_file():
            return cls(file.read_text(encoding="utf-8"), specials)
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: "default" is the chat's
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str):
            return cls(template, specials)
        return None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **variables: Any,
    ) -> str:
        """The prompt of ``messages`` (``{"role", "content"}`` mappings), ending with the
        assistant's turn opened when ``add_generation_prompt``; ``variables`` are passed
        to the template too (``tools``, ``documents``, ...).

        Raises:
            ChatTemplateError: the template raised (its ``raise_exception`` message) or
                failed to render.
        """
        context = {
            **self.special_tokens,
            **variables,
            "messages": [dict(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(context)
        except ChatTemplateError:
            raise
        except self._errors as exc:
            raise ChatTemplateError(f"the chat template failed: {exc}") from None


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: JSON as written, not escaped for HTML."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)
