"""Embedding and reranking folders served as models: text in, vectors or scores out.

An exporter's folder (:attr:`~aioinfer.serving.repository.ModelEntry.folder`) holding an
encoder with its tokenizer — a sentence-transformers folder, an optimum
``feature-extraction`` export, an optimum ``text-classification`` export of a
cross-encoder (one label) — is served through a text pipeline
(:class:`~aioinfer.TextEmbedder`, :class:`~aioinfer.TextReranker`), so that the texts of
concurrent requests share batches by tokens whatever the transport. A decoder export
(generation's) is not one: its ``config.json`` names a causal LM architecture, it has a
``generation_config.json``, or its model takes ``past_key_values.*``.

:class:`ServedTextModel` is a :class:`~aioinfer.serving.models.ServedModel` (admission,
statistics, metadata, readiness as any model) whose protocol tensors are text: an
embedder takes ``text`` (BYTES ``[n]``) and answers ``embeddings`` (FP32 ``[n, dim]``);
a reranker takes ``query`` (BYTES ``[1]``) and ``documents`` (BYTES ``[n]``) and answers
``scores`` (FP32 ``[n]``, in the documents' order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import numpy as np
import onnx_ir as ir

from aioinfer.core import Core
from aioinfer.errors import AioinferError, ErrorKind, ServiceError
from aioinfer.model import Port
from aioinfer.pipelines import RerankResult, TextEmbedder, TextReranker
from aioinfer.pipelines.encoder import TextPipeline
from aioinfer.pipelines.folder import TEXT_CLASSIFICATION, TextModelFolder, read_folder
from aioinfer.results import InferResults
from aioinfer.serving.messages import datatype
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES, SequenceFlags, ServedModel
from aioinfer.serving.repository import ModelConfig, ModelEntry
from aioinfer.text.tokenizer import TOKENIZER_FILE, Encoding, read_json_object

TEXT_INPUT = "text"
EMBEDDINGS_OUTPUT = "embeddings"
QUERY_INPUT = "query"
DOCUMENTS_INPUT = "documents"
SCORES_OUTPUT = "scores"

DECODER_ARCHITECTURES = ("ForCausalLM", "LMHeadModel")
"""How the architectures of a decoder's ``config.json`` end (generation serves those)."""

TEXT_MAX_CONCURRENCY = 512
"""Requests a text model takes at once when its config sets no ``max_concurrency``: its
pipeline batches their texts itself (every waiting text is a candidate for the next
batch), so admission only bounds the memory of pending texts."""


def decoder_reason(folder: Path, input_names: Sequence[str]) -> str | None:
    """Why ``folder`` (with a model taking ``input_names``) is a decoder's export, or
    None when it is not one."""
    architectures = read_json_object(folder / "config.json").get("architectures") or []
    causal = [str(a) for a in architectures if str(a).endswith(DECODER_ARCHITECTURES)]
    if causal:
        return f"its architecture is {causal[0]}"
    if (folder / "generation_config.json").is_file():
        return "it has a generation_config.json"
    if any(name.startswith("past_key_values") for name in input_names):
        return "its model takes past_key_values"
    return None


def text_pipeline_folder(entry: ModelEntry) -> TextModelFolder | None:
    """What ``entry``'s folder holds for a text pipeline, or None when it is no text
    pipeline's: not an exporter's folder, no ``tokenizer.json``, a decoder's export (by
    its files), or a classifier of more than one label (served as a plain model).

    Raises:
        ModelFolderError: a sentence-transformers folder (or a text export) that is
            malformed or uses a module or pooling the pipelines do not support.
    """
    folder = entry.folder
    if folder is None or decoder_reason(folder, ()):
        return None
    found = read_folder(folder)
    if not (found.tokenizer / TOKENIZER_FILE).is_file():
        return None
    if found.layout == TEXT_CLASSIFICATION and found.num_labels != 1:
        return None
    return found


async def load_text_model(
    core: Core,
    entry: ModelEntry,
    version: str,
    path: Path,
    max_sequences: int = DEFAULT_MAX_SEQUENCES,
) -> ServedTextModel | None:
    """Version ``version`` of ``entry`` (its model file ``path``) served through its
    text pipeline, read and compiled off the event loop on the config's device (AUTO by
    default) with its hint and properties; None when its folder is no text pipeline's
    (:func:`text_pipeline_folder`, or a model taking ``past_key_values``).

    Raises:
        ModelFolderError: as :func:`text_pipeline_folder`, or the model lacks the inputs
            or outputs its pipeline needs.
        CompileError: the device cannot compile the model.
    """
    found = await anyio.to_thread.run_sync(text_pipeline_folder, entry)
    if found is None:
        return None
    model = await core.read_model_async(str(path))
    if decoder_reason(found.path, [port.name for port in model.inputs]):
        return None
    config = entry.config
    properties = dict(config.properties)
    if config.hint is not None:
        properties["PERFORMANCE_HINT"] = config.hint
    kind = TextReranker if found.layout == TEXT_CLASSIFICATION else TextEmbedder
    pipeline = await kind.load(
        found.path, config.device or "AUTO", properties, core=core, model=model
    )
    return ServedTextModel(entry.name, version, pipeline, config, max_sequences)


def _text_port(index: int, name: str, shape: tuple[int | str, ...]) -> Port:
    return Port(index, name, ir.DataType.STRING, shape)


def _float_port(index: int, name: str, shape: tuple[int | str, ...]) -> Port:
    return Port(index, name, ir.DataType.FLOAT, shape)


class ServedTextModel(ServedModel):
    """A served model version whose requests are texts, computed by its text pipeline
    (:attr:`pipeline`): an embedder's or a reranker's. Infer requests take and give the
    tensors of the module's docstring; :meth:`embed` and :meth:`rerank` serve the
    embedding and rerank endpoints."""

    def __init__(
        self,
        name: str,
        version: str,
        pipeline: TextPipeline,
        config: ModelConfig,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
    ) -> None:
        concurrency = config.max_concurrency or TEXT_MAX_CONCURRENCY
        config = dataclasses.replace(config, max_concurrency=concurrency)
        super().__init__(name, version, pipeline.compiled, config, max_sequences)
        self.pipeline = pipeline
        self.task = "embed" if isinstance(pipeline, TextEmbedder) else "rerank"
        """What the model does: ``"embed"`` or ``"rerank"``."""
        if isinstance(pipeline, TextEmbedder):
            self._inputs = [_text_port(0, TEXT_INPUT, ("n",))]
            self._outputs = [_float_port(0, EMBEDDINGS_OUTPUT, ("n", pipeline.dimensions or -1))]
        else:
            self._inputs = [
                _text_port(0, QUERY_INPUT, (1,)),
                _text_port(1, DOCUMENTS_INPUT, ("n",)),
            ]
            self._outputs = [_float_port(0, SCORES_OUTPUT, ("n",))]
        self.output_names = [port.name for port in self._outputs]
        self.input_datatypes = {port.name: datatype(port.dtype) for port in self._inputs}

    @property
    def inputs(self) -> list[Port]:
        """The protocol inputs: texts (BYTES)."""
        return self._inputs

    @property
    def outputs(self) -> list[Port]:
        """The protocol outputs: vectors or scores (FP32)."""
        return self._outputs

    @property
    def embedder(self) -> TextEmbedder:
        """The model's embedder.

        Raises:
            ServiceError: INVALID_ARGUMENT, the model is a reranker.
        """
        if not isinstance(self.pipeline, TextEmbedder):
            raise ServiceError(
                f"model {self.name!r} is a reranker: expected an embedding model",
                ErrorKind.INVALID_ARGUMENT,
            )
        return self.pipeline

    @property
    def reranker(self) -> TextReranker:
        """The model's reranker.

        Raises:
            ServiceError: INVALID_ARGUMENT, the model is an embedder.
        """
        if not isinstance(self.pipeline, TextReranker):
            raise ServiceError(
                f"model {self.name!r} is an embedding model: expected a reranker",
                ErrorKind.INVALID_ARGUMENT,
            )
        return self.pipeline

    def batch_sizes(self) -> dict[int, int]:
        """The pipeline's batches so far, by number of texts."""
        return dict(self.pipeline.statistics.batch_sizes)

    async def embed(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        dimensions: int | None,
        truncate: bool,
    ) -> tuple[np.ndarray, int]:
        """The embeddings of ``texts`` (strings, or token-id lists taken as the encoder
        reads them) and their tokens, within the model's admission; with
        ``dimensions``, each vector keeps its first values and is renormalized.

        Raises:
            ServiceError: UNAVAILABLE, the model's queue is full; INVALID_ARGUMENT, the
                model is a reranker, or texts, ids or ``dimensions`` the embedder refuses
                (see :meth:`TextEmbedder.embed`); the kind of any other error of the
                runtime (:meth:`ErrorKind.of`).
        """
        embedder = self.embedder
        async with self.slot():
            with _service_errors():
                encodings: list[Encoding]
                if texts and not isinstance(texts[0], str):
                    encodings = embedder.token_encodings(texts, truncate=truncate)  # type: ignore[arg-type]
                else:
                    encodings = await embedder.tokenize(texts, truncate=truncate)  # type: ignore[arg-type]
                normalize = True if dimensions is not None else None
                vectors = await embedder.embed_encodings(
                    encodings, normalize=normalize, dimensions=dimensions
                )
        return vectors, sum(len(encoding) for encoding in encodings)

    async def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int | None, truncate: bool
    ) -> list[RerankResult]:
        """The documents ranked against ``query`` (:meth:`TextReranker.rerank`), within
        the model's admission.

        Raises:
            ServiceError: UNAVAILABLE, the model's queue is full; INVALID_ARGUMENT, the
                model is an embedder, or a query, documents or ``top_n`` the reranker
                refuses; the kind of any other error of the runtime.
        """
        reranker = self.reranker
        async with self.slot():
            with _service_errors():
                return await reranker.rerank(query, documents, top_n=top_n, truncate=truncate)

    async def infer(
        self, inputs: dict[str, np.ndarray], sequence: SequenceFlags | None
    ) -> tuple[InferResults, float]:
        """Embed the ``text`` input, or score the ``documents`` against the ``query``;
        the seconds waited for admission.

        Raises:
            ServiceError: INVALID_ARGUMENT, a sequence, a missing or unknown input, an
                input of no text; UNAVAILABLE, the model's queue is full.
            TextInputError: texts the pipeline refuses.
        """
        if sequence is not None:
            raise ServiceError(
                f"model {self.name!r} is a text model: it takes no sequence",
                ErrorKind.INVALID_ARGUMENT,
            )
        expected = [port.name for port in self._inputs]
        if sorted(inputs) != sorted(expected):
            raise ServiceError(
                f"model {self.name!r}: expected the inputs {expected}, got {sorted(inputs)}",
                ErrorKind.INVALID_ARGUMENT,
            )
        texts = {name: _texts(name, array) for name, array in inputs.items()}
        async with self.slot() as waited:
            if isinstance(self.pipeline, TextEmbedder):
                result = await self.pipeline.embed(texts[TEXT_INPUT])
            else:
                reranker = self.reranker
                query = texts[QUERY_INPUT]
                if len(query) != 1:
                    raise ServiceError(
                        f"input {QUERY_INPUT!r}: expected one text, got {len(query)}",
                        ErrorKind.INVALID_ARGUMENT,
                    )
                ranked = await reranker.rerank(query[0], texts[DOCUMENTS_INPUT])
                result = np.empty(len(ranked), dtype=np.float32)
                for item in ranked:
                    result[item.index] = item.score
        return InferResults(self._outputs, [result.astype(np.float32, copy=False)]), waited

    async def close(self) -> None:
        """Close the pipeline: its compiled model and its tokenizer's thread."""
        await super().close()
        self.pipeline.tokenizer.close()


@contextmanager
def _service_errors() -> Iterator[None]:
    """An error of the runtime as the service's, of its kind (:meth:`ErrorKind.of`)."""
    try:
        yield
    except ServiceError:
        raise
    except AioinferError as exc:
        raise ServiceError(str(exc), ErrorKind.of(exc)) from exc


def _texts(name: str, array: np.ndarray) -> list[str]:
    """The strings of a BYTES input (any shape, read in order)."""
    if array.dtype.kind not in "OSU":
        raise ServiceError(
            f"input {name!r}: expected BYTES (texts), got {datatype(array.dtype)}",
            ErrorKind.INVALID_ARGUMENT,
        )
    texts = []
    for index, item in enumerate(array.reshape(-1).tolist()):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise ServiceError(
                    f"input {name!r}[{index}]: expected UTF-8 text, got bytes that are not",
                    ErrorKind.INVALID_ARGUMENT,
                ) from None
        texts.append(str(item))
    return texts
