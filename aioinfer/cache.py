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
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
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
        OSError: the entry cannot be written.
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
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_bytes(blob)
    os.replace(partial, path)  # atomic: a concurrent reader sees all or nothing
    return compiled


def _load_entry(
    plugin: Plugin, model: Model, path: Path, config: Mapping[str, Any]
) -> CompiledModel | None:
    """The compiled model of the entry at ``path``; None when there is none or it cannot
    be used. The config's run-time (mutable) properties override the entry's, as for
    ``import_model``; the others are in the key, so the entry has the same."""
    if not path.is_file():
        return None
    overrides = {
        name: value
        for name, value in ((property_name(k), v) for k, v in config.items())
        if name in plugin.properties and plugin.properties[name].mutable
    }
    try:
        exported = load(path.read_bytes(), plugin.device_name)
        if (exported.inputs, exported.outputs) != (model.inputs, model.outputs):
            raise InvalidBlobError("the cached blob holds another model: its ports differ")
        compiled = plugin.import_exported(exported, overrides)
    except (ImportModelError, OSError):
        return None  # an entry that cannot be used is compiled again and replaced
    compiled.mark_loaded_from_cache()
    return compiled


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
