"""A tokenizer read from a model folder, encoding batches off the event loop.

A folder as transformers, sentence-transformers and optimum write it holds the
``tokenizers`` library's ``tokenizer.json``, and beside it ``tokenizer_config.json`` and
``special_tokens_map.json`` with what the library's file does not say: the model's
maximum length, the padding and truncation sides, the special tokens. :class:`Tokenizer`
reads them all and encodes on a thread of its own (one per tokenizer: the library
parallelizes a batch itself, and a second thread would only contend with the encoder),
so a long batch never stalls the loop.

The library's truncation is the one transformers applies (``truncation=True``:
longest first for pairs, special tokens counted); a text that must not be truncated is
encoded without it and refused when too long.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aioinfer.errors import AioinferError, ModelFolderError, TextTooLongError
from aioinfer.plugin.executors import ThreadExecutor

TOKENIZER_FILE = "tokenizer.json"
_UNSET_MAX_LENGTH = 10**12
"""transformers writes ``model_max_length`` as 1e30 when the model has no maximum."""
_SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")

TextInput = str | tuple[str, str]
"""One text, or a pair of texts (a query and a document for a cross-encoder)."""


@dataclass(frozen=True)
class Encoding:
    """One encoded text: token ids and token type ids (segment ids, 1 on the second text
    of a pair), without padding."""

    ids: np.ndarray
    type_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or an empty one when there is no such file.

    Raises:
        ModelFolderError: the file is not JSON, or not an object.
    """
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(value, dict):
        raise ModelFolderError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _token_text(value: Any) -> str | None:
    """A special token as the config files write it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """The tokenizer of a model folder (``tokenizer.json`` and its config files).

    Build one with :meth:`from_folder`. :meth:`encode` encodes a batch on the
    tokenizer's own thread; :meth:`encode_sync` is the same on the calling thread.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_length: int | None = None,
        padding_side: str = "right",
        truncation_side: str = "right",
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        """Wrap a ``tokenizers.Tokenizer``. ``max_length`` is the model's maximum in
        tokens (None: no maximum); ``special_tokens`` maps ``"pad"``, ``"cls"``, ... to
        the token texts."""
        self._full = tokenizer
        self._full.no_truncation()
        self._full.no_padding()
        self.max_length = max_length
        self.padding_side = padding_side
        self.special_tokens = dict(special_tokens or {})
        self._truncating = None
        if max_length is not None:
            self._truncating = type(tokenizer).from_str(tokenizer.to_str())
            self._truncating.enable_truncation(max_length, direction=truncation_side)
        pad = self.special_tokens.get("pad")
        pad_id = tokenizer.token_to_id(pad) if pad is not None else None
        self.pad_token_id: int = 0 if pad_id is None else pad_id
        self._executor = ThreadExecutor("tokenizer", 1)

    @classmethod
    def from_folder(cls, folder: str | Path, *, max_length: int | None = None) -> Tokenizer:
        """The tokenizer of ``folder``: its ``tokenizer.json``, with the maximum length
        (``model_max_length``), padding and truncation sides and special tokens of its
        ``tokenizer_config.json`` and ``special_tokens_map.json``. ``max_length``
        overrides the folder's maximum.

        Raises:
            ModelFolderError: no ``tokenizer.json`` (or it cannot be read), or the
                ``tokenizers`` package is missing.
        """
        folder = Path(folder)
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise ModelFolderError(
                f"{folder}: expected a {TOKENIZER_FILE} (the tokenizers library's file), found none"
            )
        library = read_library_tokenizer(path)
        config = read_json_object(folder / "tokenizer_config.json")
        specials: dict[str, str] = {}
        for source in (read_json_object(folder / "special_tokens_map.json"), config):
            for name in _SPECIAL_NAMES:
                text = _token_text(source.get(f"{name}_token"))
                if text is not None:
                    specials[name] = text
        if max_length is None:
            configured = config.get("model_max_length")
            if isinstance(configured, (int, float)) and 0 < configured < _UNSET_MAX_LENGTH:
                max_length = int(configured)
        return cls(
            library,
            max_length=max_length,
            padding_side=str(config.get("padding_side", "right")),
            truncation_side=str(config.get("truncation_side", "right")),
            special_tokens=specials,
        )

    def encode_sync(self, texts: Sequence[TextInput], *, truncate: bool = True) -> list[Encoding]:
        """Encode ``texts`` (strings, or pairs of strings) with the model's special tokens,
        on the calling thread. With ``truncate``, each is cut to :attr:`max_length`
        tokens as transformers does; without, a longer one is refused.

        Raises:
            TextTooLongError: ``truncate`` is False and a text has more than
                :attr:`max_length` tokens (the message names its index and length).
        """
        library = self._truncating if truncate and self._truncating is not None else self._full
        encoded = library.encode_batch(list(texts), add_special_tokens=True)
        if not truncate and self.max_length is not None:
            for index, encoding in enumerate(encoded):
                if len(encoding.ids) > self.max_length:
                    raise TextTooLongError(
                        f"text {index} has {len(encoding.ids)} tokens, more than the "
                        f"model's maximum of {self.max_length} (truncation is off)"
                    )
        return [
            Encoding(
                np.asarray(encoding.ids, dtype=np.int64),
                np.asarray(encoding.type_ids, dtype=np.int64),
            )
            for encoding in encoded
        ]

    async def encode(self, texts: Sequence[TextInput], *, truncate: bool = True) -> list[Encoding]:
        """:meth:`encode_sync` on the tokenizer's own thread; the event loop stays free.

        Raises:
            TextTooLongError: as :meth:`encode_sync`.
        """
        items = list(texts)
        return await self._executor.run(lambda: self.encode_sync(items, truncate=truncate))

    @property
    def vocab_size(self) -> int:
        """The number of token ids (added tokens included)."""
        return int(self._full.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token`` in the vocabulary, or None."""
        result = self._full.token_to_id(token)
        return None if result is None else int(result)

    def close(self) -> None:
        """Stop the tokenizer's thread (encodings already running finish)."""
        self._executor.close()


def read_library_tokenizer(path: Path, error: type[AioinferError] = ModelFolderError) -> Any:
    """The ``tokenizers`` library's tokenizer of the file ``path``.

    Raises:
        ``error``: the ``tokenizers`` package is missing, or ``path`` is no tokenizers
            file (the message names it).
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise error(
            f"{path}: reading a tokenizer needs the tokenizers package "
            "(pip install 'aioinfer[tokenizers]')"
        ) from exc
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises plain Exception on a bad file
        raise error(f"{path}: not a tokenizers file ({exc})") from exc
