"""A decoder as an exporter writes it, served for generation with nothing added.

``optimum-cli export onnx --task text-generation-with-past`` writes ``model.onnx`` (its KV
cache as ``past_key_values.*`` inputs and ``present.*`` outputs) beside the Hugging Face
model's ``config.json``, ``generation_config.json`` and the tokenizer's files. Such a
folder, with no ``generate`` key of aioinfer's, is served as a decoder when
:func:`is_decoder_export` says so, by the first rule that holds:

1. its ``config.json`` names an architecture ending in ``ForCausalLM`` or
   ``LMHeadModel`` (transformers' names for text generation heads);
2. it has a ``generation_config.json``;
3. the model has an input named ``past_key_values.*`` (optimum's KV cache).

Such a model is compiled with ``STATEFUL`` ``"auto"`` (the cache kept in the request) and
the ``LATENCY`` hint (one batched step at a time, on every core), takes as many
concurrent requests (``max_concurrency``) as its scheduler has places, and generates with the
end-of-sequence tokens and length of its ``generation_config.json``; its tokenizer,
defaults and chat template are read from the folder by the model's
:class:`~aioinfer.serving.generation.ModelGeneration`. A config given for the model
(its ``generate``, ``stateful``, ``hint``) overrides any of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import anyio.to_thread

from aioinfer.errors import RepositoryError
from aioinfer.generation.config import GenerationConfig
from aioinfer.offline import is_blob_file
from aioinfer.serving.repository import ModelEntry
from aioinfer.text.generator import GenerationDefaults
from aioinfer.text.tokenizer import read_json_object

DECODER_ARCHITECTURE_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""How transformers names the architectures that generate text."""
CACHE_INPUT_PREFIX = "past_key_values."
DECODER_HINT = "LATENCY"
"""The hint a decoder folder is compiled with unless its config sets one: its scheduler
runs one batched step at a time, which every core should compute (THROUGHPUT's streams
would give each step a share of them)."""
"""optimum's name for the KV cache inputs of a decoder exported with past."""


def is_decoder_export(folder: Path, input_names: Iterable[str] | None = None) -> bool:
    """Whether the exporter's ``folder`` holds a decoder (see the module's rules);
    ``input_names`` are the model's inputs (None: not known, rule 3 is not applied)."""
    architectures = read_json_object(folder / "config.json").get("architectures")
    if isinstance(architectures, list) and any(
        isinstance(name, str) and name.endswith(DECODER_ARCHITECTURE_SUFFIXES)
        for name in architectures
    ):
        return True
    if (folder / "generation_config.json").is_file():
        return True
    return input_names is not None and any(
        name.startswith(CACHE_INPUT_PREFIX) for name in input_names
    )


async def served_decoder(entry: ModelEntry) -> ModelEntry:
    """``entry`` as served: when it is an exporter's decoder folder without a
    ``generate`` config, its config with ``stateful`` ``"auto"`` (unless set) and a
    ``generate`` from its ``generation_config.json``; else ``entry`` itself. Reads files
    on a worker thread.

    Raises:
        ModelFolderError: a config file of the folder that is not a JSON object.
        RepositoryError: the model file is not a readable ONNX model.
    """
    folder = entry.folder
    if folder is None or entry.config.generate is not None:
        return entry
    return await anyio.to_thread.run_sync(_served_decoder, entry, folder)


def _served_decoder(entry: ModelEntry, folder: Path) -> ModelEntry:
    if not is_decoder_export(folder) and not is_decoder_export(
        folder, _input_names(next(iter(entry.versions.values())))
    ):
        return entry
    generate = GenerationDefaults.from_folder(folder).config_values()
    stateful = entry.config.stateful if entry.config.stateful is not None else "auto"
    hint = entry.config.hint or DECODER_HINT
    # A generation holds one of the model's slots while it runs: as many as the scheduler
    # has places, so that the slots do not keep its batch smaller.
    places = GenerationConfig.from_mapping(generate).max_running_sequences
    config = dataclasses.replace(
        entry.config,
        stateful=stateful,
        generate=generate,
        hint=hint,
        max_concurrency=entry.config.max_concurrency or places,
    )
    return dataclasses.replace(entry, config=config)


def _input_names(path: Path) -> list[str]:
    """The input names of the ONNX model at ``path`` (its weights left on disk)."""
    import onnx

    if is_blob_file(path):  # compiled ahead: not an exporter's file
        return []
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # onnx raises its parser's own errors
        raise RepositoryError(f"{path}: not a readable ONNX model ({exc})") from exc
    return [value.name for value in graph.input]
