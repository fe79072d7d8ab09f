"""Text embeddings from a model folder: ``await TextEmbedder.load(folder)``, then
``await embedder.embed(texts)``.

Tokenize -> encoder (token vectors) -> pooling -> normalization, as the folder's
sentence-transformers modules say (or mean pooling for an optimum feature-extraction
export); the texts of concurrent calls are batched by tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aioinfer.errors import ModelFolderError, TextInputError, TextTooLongError, TextTypeError
from aioinfer.pipelines.encoder import TextPipeline, check_texts
from aioinfer.pipelines.folder import FEATURE_EXTRACTION, SENTENCE_TRANSFORMERS
from aioinfer.pipelines.pooling import normalize as l2_normalize
from aioinfer.pipelines.pooling import pool
from aioinfer.text.tokenizer import Encoding

_TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


class TextEmbedder(TextPipeline):
    """Embeddings of texts by a sentence-transformers folder or an optimum
    feature-extraction export. Build one with :meth:`load`
    (``await TextEmbedder.load(folder)``)."""

    _layouts = (SENTENCE_TRANSFORMERS, FEATURE_EXTRACTION)

    def _check_outputs(self) -> None:
        outputs = {port.name: port for port in self.compiled.outputs}
        named = [name for name in _TOKEN_OUTPUTS if name in outputs]
        ranked = [port.name for port in self.compiled.outputs if port.rank == 3]
        if not named and not ranked:
            raise ModelFolderError(
                f"{self.folder.onnx}: expected an output of token vectors "
                f"({' or '.join(_TOKEN_OUTPUTS)}, rank 3), got {sorted(outputs)}"
            )
        self._output = (named or ranked)[0]

    @property
    def normalizes(self) -> bool:
        """Whether :meth:`embed` normalizes by default (the folder has a Normalize
        module)."""
        return self.folder.normalize

    @property
    def prompts(self) -> dict[str, str]:
        """The folder's named prompts (``config_sentence_transformers.json``)."""
        return dict(self.folder.prompts)

    async def embed(
        self,
        texts: Sequence[str],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = True,
    ) -> np.ndarray:
        """The embeddings of ``texts``: a float32 array ``[len(texts), dim]``.

        Args:
            texts: the texts (a non-empty list of strings).
            normalize: L2-normalize each vector (None: as the folder says).
            dimensions: keep only the first ``dimensions`` values of each vector (for
                models trained for it, Matryoshka), renormalized when normalizing.
            prompt_name: a prompt of :attr:`prompts` to prepend to each text (None: the
                folder's default prompt, if any).
            prompt: a prompt to prepend to each text, instead of a named one.
            truncate: cut texts longer than :attr:`max_length` tokens, as
                sentence-transformers does; False refuses them.

        Raises:
            TextInputError: an empty list, an unknown prompt name, ``dimensions`` out of
                range.
            TextTypeError: a text that is not a string.
            TextTooLongError: ``truncate`` is False and a text is too long.
            InferenceError: the encoder failed.
        """
        encodings = await self.tokenize(
            texts, prompt_name=prompt_name, prompt=prompt, truncate=truncate
        )
        return await self.embed_encodings(encodings, normalize=normalize, dimensions=dimensions)

    @property
    def dimensions(self) -> int | None:
        """The length of the model's vectors (None: the model does not say before it
        runs)."""
        port = next(port for port in self.compiled.outputs if port.name == self._output)
        width = port.shape[-1] if port.shape else None
        return width if isinstance(width, int) else None

    async def tokenize(
        self,
        texts: Sequence[str],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = True,
    ) -> list[Encoding]:
        """The encodings of ``texts`` as :meth:`embed` computes them (the prompt
        prepended; arguments and errors as there), for a caller that counts their tokens
        before :meth:`embed_encodings`."""
        items = check_texts(texts)
        prefix = self._prompt(prompt_name, prompt)
        if prefix:
            items = [prefix + text for text in items]
        return await self.tokenizer.encode(items, truncate=truncate)

    def token_encodings(
        self, token_ids: Sequence[Sequence[int]], *, truncate: bool = True
    ) -> list[Encoding]:
        """Encodings of texts given as token ids, taken as the encoder reads them: no
        special token is added, and with ``truncate`` a longer list keeps its first
        :attr:`max_length` ids.

        Raises:
            TextInputError: an empty list (of lists, or of ids), an id outside the
                vocabulary; a list longer than :attr:`max_length` when ``truncate`` is
                False (TextTooLongError).
            TextTypeError: an id that is not an int.
        """
        if not token_ids:
            raise TextInputError("token ids: expected at least one list, got an empty list")
        vocabulary = self.tokenizer.vocab_size
        limit = self.max_length
        encodings = []
        for index, ids in enumerate(token_ids):
            if not ids:
                raise TextInputError(f"token ids[{index}]: expected at least one id, got none")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise TextTypeError(f"token ids[{index}]: expected ints, got {list(ids)!r:.80}")
            array = np.asarray(ids, dtype=np.int64)
            if array.min() < 0 or array.max() >= vocabulary:
                raise TextInputError(
                    f"token ids[{index}]: expected ids from 0 to {vocabulary - 1} (the "
                    f"vocabulary), got {int(array.min())} to {int(array.max())}"
                )
            if limit is not None and len(array) > limit:
                if not truncate:
                    raise TextTooLongError(
                        f"text {index} has {len(array)} tokens, more than the model's "
                        f"maximum of {limit} (truncation is off)"
                    )
                array = array[:limit]
            encodings.append(Encoding(array, np.zeros_like(array)))
        return encodings

    async def embed_encodings(
        self,
        encodings: Sequence[Encoding],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """The embeddings of texts already encoded (:meth:`tokenize`,
        :meth:`token_encodings`); ``normalize`` and ``dimensions`` as :meth:`embed`.

        Raises:
            TextInputError: ``dimensions`` out of range.
            InferenceError: the encoder failed.
        """
        vectors = np.stack(await self._batcher.run(encodings))
        if dimensions is not None:
            width = vectors.shape[1]
            if isinstance(dimensions, bool) or not isinstance(dimensions, int):
                raise TextInputError(f"dimensions: expected an int, got {dimensions!r}")
            if not 1 <= dimensions <= width:
                raise TextInputError(
                    f"dimensions: expected 1 to {width} (the model's), got {dimensions}"
                )
            vectors = vectors[:, :dimensions]
        if self.folder.normalize if normalize is None else normalize:
            vectors = l2_normalize(vectors)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _prompt(self, name: str | None, prompt: str | None) -> str:
        if prompt is not None:
            return prompt
        name = name if name is not None else self.folder.default_prompt_name
        if name is None:
            return ""
        if name not in self.folder.prompts:
            raise TextInputError(
                f"prompt_name: expected one of {sorted(self.folder.prompts)}, got {name!r}"
            )
        return self.folder.prompts[name]

    def _reduce(self, outputs: dict[str, np.ndarray], mask: np.ndarray) -> Sequence[np.ndarray]:
        tokens = outputs[self._output].astype(np.float32, copy=False)
        return list(pool(tokens, mask, self.folder.pooling))
