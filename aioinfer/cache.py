"""The model cache (``CACHE_DIR``): the Core's, over any device's export and import.

A device opts in by declaring ``CACHE_DIR`` (and ``LOADED_FROM_CACHE``): its compiled
models export (:meth:`CompiledModel.export_model`) and its plugin imports. The device
never sees the cache: compiling with ``CACHE_DIR`` keys the model by a SHA-256 of its
nodes, ports, functions and weight bytes, the device, the parsed config (without
``CACHE_DIR``), the aioinfer version and the blob format version; an entry found is
imported through the plugin (no pass runs); otherwise the model is compiled and its
blob stored, atomically. An entry that cannot be imported (damaged, of another version
or device, with a config the device refuses, not self-contained) or that holds another
model (its ports differ) is ignored, and replaced by the compile.

The cache directory may be shared, or written by someone else, so an entry is read only
when it is a regular file of its own: a symbolic link (dangling or not) is never followed
and a hard link (another name of a file that may lie elsewhere) never read, so nothing
outside the directory is read; a directory, a pipe or a file that cannot be read is a
broken entry like any other. The compile replaces each by a file written under a fresh,
unguessable name and renamed over the entry, so nothing outside is written either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from aioinfer.errors import ExportError, ImportModelError, InvalidBlobError
from aioinfer.plugin.blob import FORMAT_VERSION, aioinfer_version, load
from aioinfer.properties import property_name

if TYPE_CHECKING:
    from aioinfer.model import Model
    from aioinfer.plugin.compiled_model import CompiledModel
    from aioinfer.plugin.plugin import Plugin


def compile_cached(plugin: Plugin, model: Model, config: Mapping[str, Any]) -> CompiledModel:
    """``plugin.compile_model(model, config)`` through the model cache of the config's
    ``CACHE_DIR`` (none, or a device that does not declare it: compile).

    Raises:
        AioinferError: what ``plugin.compile_model`` raises (a bad config, an operator
            the device cannot run).
        OSError: the entry cannot be written (the directory is not writable); a broken
            entry is never the cause.
    """
    if "CACHE_DIR" not in plugin.properties:  # a virtual device: its target may cache
        return plugin.compile_model(model, config)
    parsed = plugin.parse_config(config)
    cache_dir = parsed["CACHE_DIR"]
    if not cache_dir:
        return plugin.compile_model(model, config)
    path = Path(cache_dir) / f"{cache_key(model, plugin.device_name, parsed)}.blob"
    cached = _load_entry(plugin, model, path, config)
    if cached is not None:
        return cached
    compiled = plugin.compile_model(model, config)
    try:
        blob = compiled.export_model()
    except ExportError:
        return compiled  # what the device compiled does not export (state kept above it)
    _store(path, blob)
    return compiled


def _load_entry(
    plugin: Plugin, model: Model, path: Path, config: Mapping[str, Any]
) -> CompiledModel | None:
    """The compiled model of the entry at ``path``; None when there is none or it cannot
    be used. The config's run-time (mutable) properties override the entry's, as for
    ``import_model``; the others are in the key, so the entry has the same."""
    data = _read_entry(path)
    if data is None:
        return None
    overrides = {
        name: value
        for name, value in ((property_name(k), v) for k, v in config.items())
        if name in plugin.properties and plugin.properties[name].mutable
    }
    try:
        exported = load(data, plugin.device_name)
        if (exported.inputs, exported.outputs) != (model.inputs, model.outputs):
            raise InvalidBlobError("the cached blob holds another model: its ports differ")
        compiled = plugin.import_exported(exported, overrides)
    except ImportModelError:
        return None  # an entry that cannot be used is compiled again and replaced
    compiled.mark_loaded_from_cache()
    return compiled


_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_entry(path: Path) -> bytes | None:
    """The bytes of the entry at ``path`` when it is a regular file with no other name;
    None for anything else: no entry, a symbolic link (not followed), a hard link, a
    directory, a pipe or device (opened without waiting for a writer), or a read error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            return None
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _store(path: Path, blob: bytes) -> None:
    """Write ``blob`` as the entry at ``path``, replacing whatever is there (a broken
    entry: a file, a link, which is replaced and not followed, or a directory, which is
    removed) at once: a concurrent reader sees the old entry or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fresh name, created here (O_EXCL: not through a link someone put in its place).
    partial = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW
    fd = os.open(partial, flags, 0o666)  # the umask applies, as to any file written
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(blob)
        try:
            os.replace(partial, path)
        except IsADirectoryError:  # a directory where the entry goes
            with contextlib.suppress(FileNotFoundError):  # a concurrent compile removed it
                shutil.rmtree(path)  # its own links are removed, never followed
            os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def cache_key(model: Model, device: str, config: Mapping[str, Any]) -> str:
    """The model-cache key: a hash of the model (its nodes, ports, functions and weight
    bytes, without serializing the weights into a proto), the device, the config (without
    ``CACHE_DIR``), the aioinfer version and the export format version."""
    digest = hashlib.sha256()
    ir_model = model.ir
    graph = ir_model.graph
    digest.update(json.dumps(sorted(ir_model.opset_imports.items())).encode())
    for value in (*graph.inputs, *graph.outputs):
        digest.update(ir.serde.serialize_value(value).SerializeToString(deterministic=True))
    for node in graph:
        digest.update(ir.serde.serialize_node(node).SerializeToString(deterministic=True))
    for function in ir_model.functions.values():
        digest.update(ir.serde.serialize_function(function).SerializeToString(deterministic=True))
    for name, value in graph.initializers.items():
        tensor = value.const_value
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        if tensor is not None:
            digest.update(tensor.tobytes())
    settings = {k: v for k, v in config.items() if k != "CACHE_DIR"}
    identity = [device, settings, aioinfer_version(), FORMAT_VERSION]
    digest.update(json.dumps(identity, sort_keys=True).encode())
    return digest.hexdigest()
