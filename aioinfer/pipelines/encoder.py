"""What every text pipeline shares: a folder's tokenizer and compiled encoder, the token
batcher, and the stages of one batch.

A call runs as stages, each awaited, so cancelling the calling task stops it between
(or inside) them: tokenize its texts (the tokenizer's thread) -> the batcher, where
its texts join a batch -> pad the batch and run the encoder on the device (an infer
request of the compiled model) -> the pipeline's own reduction of the batch's output
(pooling, scores; on a worker thread) -> split back to the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import numpy as np

from aioinfer.core import Core
from aioinfer.errors import ModelFolderError, TextInputError, TextTypeError
from aioinfer.model import Model
from aioinfer.pipelines.batching import BatchStatistics, TokenBatcher, TokenBatching
from aioinfer.pipelines.folder import TextModelFolder, read_folder
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.text.tokenizer import Encoding, TextInput, Tokenizer

P = TypeVar("P", bound="TextPipeline")

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""The encoder inputs a text pipeline feeds (a model needs not take all of them)."""


def check_texts(texts: object, what: str = "texts") -> list[str]:
    """``texts`` as a list of strings: a non-empty list (or tuple) of strings.

    Raises:
        TextInputError: an empty list, or a single string where a list was expected.
        TextTypeError: an item that is not a string (named by its index).
    """
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TextTypeError(f"{what}: expected a list of strings, got {type(texts).__name__}")
    if not texts:
        raise TextInputError(f"{what}: expected at least one text, got an empty list")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TextTypeError(f"{what}[{index}]: expected a string, got {type(text).__name__}")
    return list(texts)


def pad_batch(
    encodings: Sequence[Encoding], pad_id: int, side: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, attention mask and token type ids ``[batch, longest]``, padded on
    ``side`` (``"right"`` or ``"left"``)."""
    longest = max(len(e) for e in encodings)
    ids = np.full((len(encodings), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), longest), dtype=np.int64)
    types = np.zeros((len(encodings), longest), dtype=np.int64)
    for row, encoding in enumerate(encodings):
        n = len(encoding)
        span = slice(longest - n, longest) if side == "left" else slice(0, n)
        ids[row, span] = encoding.ids
        mask[row, span] = 1
        types[row, span] = encoding.type_ids
    return ids, mask, types


class TextPipeline:
    """The base of :class:`~aioinfer.TextEmbedder` and :class:`~aioinfer.TextReranker`:
    a model folder's tokenizer and encoder, batched by tokens."""

    _layouts: tuple[str, ...] = ()

    def __init__(
        self,
        folder: TextModelFolder,
        tokenizer: Tokenizer,
        compiled: CompiledModel,
        batching: TokenBatching,
    ) -> None:
        self.folder = folder
        self.tokenizer = tokenizer
        self.compiled = compiled
        inputs = {port.name: port for port in compiled.inputs}
        unknown = sorted(set(inputs) - set(TEXT_INPUTS))
        if unknown or "input_ids" not in inputs:
            raise ModelFolderError(
                f"{folder.onnx}: expected inputs among {list(TEXT_INPUTS)} (input_ids "
                f"among them), got {sorted(inputs)}"
            )
        self._input_dtypes = {name: port.dtype for name, port in inputs.items()}
        self._batcher: TokenBatcher[Any] = TokenBatcher(self._run_batch, batching)
        self._check_outputs()

    def _check_outputs(self) -> None:
        """Raise :class:`ModelFolderError` unless the model has the outputs the pipeline
        reads."""

    @classmethod
    async def load(
        cls: type[P],
        folder: str | Path,
        device: str = "AUTO",
        config: Mapping[str, Any] | None = None,
        *,
        batching: TokenBatching | None = None,
        core: Core | None = None,
        model: Model | None = None,
    ) -> P:
        """Read ``folder`` (recognized by its files: see :mod:`aioinfer.pipelines.folder`)
        and compile its model for ``device`` with ``config``, off the event loop.

        Args:
            folder: a sentence-transformers folder or an optimum feature-extraction export
                (:class:`~aioinfer.TextEmbedder`); an optimum text-classification export
                of a cross-encoder (:class:`~aioinfer.TextReranker`).
            device: the device of the encoder (AUTO: the first of ORT, OPENVINO, CPU).
            config: properties for the device.
            batching: how concurrent calls are batched (the defaults of
                :class:`~aioinfer.TokenBatching` otherwise).
            core: the Core to compile with (a new one otherwise).
            model: the folder's ONNX model, already read (a server reads it first to
                tell an encoder from a decoder); read from the folder otherwise.

        Raises:
            ModelFolderError: the folder is not of a layout this pipeline reads, lacks its
                model or tokenizer, or its model lacks the inputs and outputs it needs.
            CompileError: the device cannot compile the model.
        """
        found = await anyio.to_thread.run_sync(read_folder, folder)
        if found.layout not in cls._layouts:
            raise ModelFolderError(
                f"{found.path}: {cls.__name__} expected a folder of layout "
                f"{' or '.join(cls._layouts)}, got {found.layout}"
            )
        tokenizer = await anyio.to_thread.run_sync(
            lambda: Tokenizer.from_folder(found.tokenizer, max_length=found.max_length)
        )
        try:
            source = found.onnx if model is None else model
            compiled = await (core or Core()).compile_model_async(source, device, config)
        except BaseException:
            tokenizer.close()
            raise
        try:
            return cls(found, tokenizer, compiled, batching or TokenBatching())
        except BaseException:
            tokenizer.close()
            await compiled.close()
            raise

    @property
    def statistics(self) -> BatchStatistics:
        """Batches, texts, real and padded tokens computed so far."""
        return self._batcher.statistics

    @property
    def batching(self) -> TokenBatching:
        """The batching settings."""
        return self._batcher.batching

    @property
    def max_length(self) -> int | None:
        """The most tokens per text; longer ones are truncated (or refused)."""
        return self.tokenizer.max_length

    async def _encode(self, texts: Sequence[TextInput], truncate: bool) -> list[Any]:
        """The per-text results of :meth:`_reduce` for ``texts``, batched with the
        concurrent calls'."""
        encodings = await self.tokenizer.encode(texts, truncate=truncate)
        return await self._batcher.run(encodings)

    async def _run_batch(self, encodings: Sequence[Encoding]) -> Sequence[Any]:
        ids, mask, types = pad_batch(
            encodings, self.tokenizer.pad_token_id, self.tokenizer.padding_side
        )
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        inputs = {
            name: given[name].astype(dtype, copy=False)
            for name, dtype in self._input_dtypes.items()
        }
        results = await self.compiled.infer(inputs, share_inputs=True)
        return await anyio.to_thread.run_sync(self._reduce, results.to_dict(), mask)

    def _reduce(self, outputs: dict[str, np.ndarray], mask: np.ndarray) -> Sequence[Any]:
        """One result per row of the batch's ``outputs`` (runs on a worker thread)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the compiled model and the tokenizer's thread."""
        self.tokenizer.close()
        await self.compiled.close()

    async def __aenter__(self: P) -> P:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
