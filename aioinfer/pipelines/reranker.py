"""Reranking with a cross-encoder: ``await TextReranker.load(folder)``, then
``await reranker.rerank(query, documents)``.

Each (query, document) pair is encoded together, as the cross-encoder was trained,
and scored by its one logit; the pairs of concurrent calls are batched by tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aioinfer.errors import ModelFolderError, TextInputError, TextTypeError
from aioinfer.pipelines.encoder import TextPipeline, check_texts
from aioinfer.pipelines.folder import TEXT_CLASSIFICATION


@dataclass(frozen=True)
class RerankResult:
    """One document's place in a ranking.

    Attributes:
        index: the document's index in the list given to :meth:`TextReranker.rerank`.
        score: its relevance to the query (higher is more relevant).
    """

    index: int
    score: float


class TextReranker(TextPipeline):
    """Scores documents against a query with a cross-encoder exported by optimum
    (``--task text-classification``, one label). Build one with :meth:`load`
    (``await TextReranker.load(folder)``)."""

    _layouts = (TEXT_CLASSIFICATION,)

    def _check_outputs(self) -> None:
        names = [port.name for port in self.compiled.outputs]
        if "logits" not in names or self.folder.num_labels != 1:
            raise ModelFolderError(
                f"{self.folder.path}: expected a cross-encoder with a 'logits' output and "
                f"one label, got outputs {names} and {self.folder.num_labels} labels"
            )

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        truncate: bool = True,
    ) -> list[RerankResult]:
        """The documents ranked by relevance to ``query``, the most relevant first.

        The score is the one that sentence-transformers' ``CrossEncoder.predict`` gives
        by default: the sigmoid of the logit (or the logit itself when the folder's
        config names the identity as its ``activation_fn``).

        Args:
            query: the query.
            documents: the documents (a non-empty list of strings).
            top_n: return only the ``top_n`` best (None: all).
            truncate: cut pairs longer than :attr:`max_length` tokens as
                transformers does (the longer text first); False refuses them.

        Raises:
            TextInputError: an empty list of documents, ``top_n`` below 1.
            TextTypeError: a query or document that is not a string.
            TextTooLongError: ``truncate`` is False and a pair is too long.
            InferenceError: the encoder failed.
        """
        if not isinstance(query, str):
            raise TextTypeError(f"query: expected a string, got {type(query).__name__}")
        docs = check_texts(documents, "documents")
        if top_n is not None and (
            isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1
        ):
            raise TextInputError(f"top_n: expected a positive int or None, got {top_n!r}")
        scores = await self._encode([(query, doc) for doc in docs], truncate)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])
        return [RerankResult(i, float(scores[i])) for i in order[:top_n]]

    def _reduce(self, outputs: dict[str, np.ndarray], mask: np.ndarray) -> Sequence[float]:
        logits = outputs["logits"].astype(np.float64).reshape(len(mask), -1)[:, 0]
        if self.folder.activation == "sigmoid":
            logits = 1.0 / (1.0 + np.exp(-logits))
        return logits.tolist()
