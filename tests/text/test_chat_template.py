"""Chat templates rendered as transformers renders them: whitespace control, the globals
and filters it adds, special tokens as variables, and where a folder keeps its template."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aioinfer.errors import ChatTemplateError, TextInputError
from aioinfer.text import ChatTemplate
from tests.helpers import HF_DECODERS

pytest.importorskip("jinja2")

HI = [{"role": "user", "content": "Hi"}]


def test_the_exports_template_with_its_special_tokens() -> None:
    template = ChatTemplate.from_folder(HF_DECODERS / "llama_gqa")
    assert template is not None
    messages = [{"role": "system", "content": "Be brief."}, *HI]
    assert template.render(messages) == "<s>system: Be brief.\nuser: Hi\nassistant:"
    assert template.render(messages, add_generation_prompt=False) == (
        "<s>system: Be brief.\nuser: Hi\n"
    )


def test_blocks_are_trimmed_and_stripped_as_transformers_does() -> None:
    source = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n"
        "    {% endif %}\n{% endfor %}"
    )
    # trim_blocks drops the newline after a block; lstrip_blocks the spaces before one.
    assert ChatTemplate(source).render(HI * 2) == "[Hi]\n[Hi]\n"


def test_tojson_does_not_escape_html_and_keeps_unicode() -> None:
    template = ChatTemplate("{{ messages[0] | tojson }}|{{ tools | tojson(indent=2) }}")
    rendered = template.render([{"role": "user", "content": "<b>é & ü</b>"}], tools=[{"name": "a"}])
    first, second = rendered.split("|")
    assert json.loads(first) == {"role": "user", "content": "<b>é & ü</b>"}
    assert "<b>é & ü</b>" in first  # not \u003c, not \u00e9
    assert second == json.dumps([{"name": "a"}], indent=2)


def test_raise_exception_and_strftime_now() -> None:
    source = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('users first') }}{% endif %}"
        "{{ strftime_now('%Y') }}"
    )
    template = ChatTemplate(source)
    assert re.fullmatch(r"\d{4}", template.render(HI))
    with pytest.raises(ChatTemplateError, match="users first") as refused:
        template.render([{"role": "assistant", "content": "Hello"}])
    assert isinstance(refused.value, TextInputError)


def test_the_sandbox_refuses_reaching_python() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError, match="the chat template failed"):
        template.render(HI)
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        ChatTemplate("{% for %}")


def test_template_from_tokenizer_config_and_none(tmp_path: Path) -> None:
    assert ChatTemplate.from_folder(tmp_path) is None
    config = {
        "eos_token": {"content": "</s>"},
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ messages[0].content }}{{ eos_token }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = ChatTemplate.from_folder(tmp_path)
    assert template is not None and template.render(HI) == "Hi</s>"
    (tmp_path / "chat_template.jinja").write_text("file: {{ messages[0].content }}")
    template = ChatTemplate.from_folder(tmp_path)
    assert template is not None and template.render(HI) == "file: Hi"
