"""Text of generated tokens as they come: never half a character, stop strings cut out.

A byte-level tokenizer (GPT-2's, Llama 3's, Qwen's) splits a character of several UTF-8
bytes over several tokens: decoding each token alone would print replacement characters.
:class:`IncrementalDetokenizer` decodes a window of the last tokens and holds text back
while it ends in an incomplete character, so that the chunks joined are the text of the
whole sequence. The window starts a few tokens back (the prompt's last ones at first):
tokenizers that drop or add a leading space by context (SentencePiece's ``▁``) decode a
token as they would in the sequence.

:class:`StopStrings` finds stop strings in the decoded text, across token boundaries: it
holds back the last characters that could begin one, and ends the text before the first
stop string found (which is not part of the output).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

_CONTEXT_TOKENS = 5
"""Prompt tokens decoded before the first generated one (their text is not output)."""
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """The text that each new token adds to a sequence (see the module)."""

    def __init__(
        self, tokenizer: Any, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True
    ) -> None:
        """``tokenizer`` is a ``tokenizers.Tokenizer``; ``prompt_ids`` the prompt before
        the tokens to decode (its last few give the first token its context)."""
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = [int(i) for i in prompt_ids[len(prompt_ids) - _CONTEXT_TOKENS :]]
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token: int) -> str:
        """Add ``token``; the text it completes ("" while a character is incomplete)."""
        self._ids.append(int(token))
        prefix = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if text.endswith(_INCOMPLETE) or len(text) <= len(prefix):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix) :]

    def flush(self) -> str:
        """The text held back at the end of the sequence (an incomplete character decodes
        as the replacement character, as a decode of the whole sequence would)."""
        prefix = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip))


class StopStrings:
    """The text before the first stop string, released as soon as no stop string can
    still begin in it."""

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self._hold = max((len(stop) for stop in self.stops), default=1) - 1
        self._pending = ""
        self.matched: str | None = None
        """The stop string found (None until then): the text ends before it."""

    def feed(self, text: str) -> str:
        """Add ``text``; the text that can be output now ("" after a stop string)."""
        if self.matched is not None:
            return ""
        pending = self._pending + text
        found = [(pending.find(stop), stop) for stop in self.stops]
        hits = [(index, stop) for index, stop in found if index >= 0]
        if hits:
            index, self.matched = min(hits)
            self._pending = ""
            return pending[:index]
        cut = max(0, len(pending) - self._hold)
        self._pending = pending[cut:]
        return pending[:cut]

    def flush(self) -> str:
        """The text held back, at the end of the sequence."""
        pending, self._pending = self._pending, ""
        return pending
