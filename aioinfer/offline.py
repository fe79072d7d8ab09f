"""Compiled models in files: the offline compile (``aioinfer compile``, after OpenVINO's
compile tool) and loading a model file that is either an ONNX model or an export blob.

A blob runs on the device it was compiled for: its header names it. A caller that names
no device gets that one; one that names another device gets ``BlobDeviceError``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from aioinfer.plugin.blob import MAGIC, is_blob

if TYPE_CHECKING:
    from aioinfer.core import Core
    from aioinfer.plugin.compiled_model import CompiledModel


def is_blob_file(path: str | Path) -> bool:
    """Whether the file at ``path`` starts as an export blob does (else it is taken for
    an ONNX model).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as file:
        return is_blob(file.read(len(MAGIC)))


def compile_to_file(
    core: Core,
    model: str | Path,
    device: str,
    config: Mapping[str, Any],
    output: str | Path,
) -> CompiledModel:
    """Compile the ONNX model at ``model`` for ``device`` and write its export blob to
    ``output`` (replaced atomically: a reader never sees half a blob). The device's own
    model is compiled, never wrapped in ``BATCH`` by the ``THROUGHPUT`` hint: the
    blob holds what the device exports.

    Raises:
        The errors of :meth:`Core.compile_model`; ExportError: the device does not
            export; OSError: ``output`` cannot be written.
    """
    compiled = core.compile_model(model, device, config, auto_batching=False)
    blob = compiled.export_model()
    target = Path(output)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(blob)
    partial.replace(target)
    return compiled


async def load_model_file(
    core: Core,
    path: str | Path,
    device: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> CompiledModel:
    """The compiled model of the file at ``path``, off the event loop: an export blob is
    imported (on ``device``, or on the device its header names when ``device`` is None;
    ``config`` may then set run-time properties only), anything else is read as an
    ONNX model and compiled for ``device`` (None: the Core's default device).

    Raises:
        ModelNotFoundError: no such file.
        The errors of :meth:`Core.import_model` for a blob (``BlobDeviceError``: another
            device was named), of :meth:`Core.compile_model` otherwise.
    """
    config = dict(config or {})
    try:
        blob = is_blob_file(path)
    except OSError:
        blob = False  # compile_model reports the missing or unreadable file
    if not blob:
        if device is None:
            return await core.compile_model_async(str(path), config=config)
        return await core.compile_model_async(str(path), device, config)
    return await anyio.to_thread.run_sync(
        functools.partial(_import_file, core, Path(path), device, config), abandon_on_cancel=True
    )


def _import_file(
    core: Core, path: Path, device: str | None, config: dict[str, Any]
) -> CompiledModel:
    return core.import_model(path.read_bytes(), device, config)
