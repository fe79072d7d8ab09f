"""A served model's configuration as Triton writes it, and Triton-style config overrides.

``GET /v2/models/{m}/config`` answers Triton's model configuration (the JSON form of its
``config.pbtxt``), derived from what was compiled, not from what was asked: a model
whose device batches concurrent inferences (``max_batch_size()`` of the compiled model)
has ``max_batch_size`` > 0, dims without the batch dimension and ``dynamic_batching``;
any other has ``max_batch_size`` 0 and its full shapes (-1 for a dynamic dimension).

A load request may carry a config override (tritonclient's ``load_model(name,
config=...)``): a JSON object with Triton's keys that aioinfer can honour
(``max_batch_size``, ``dynamic_batching.max_queue_delay_microseconds``,
``sequence_batching.max_sequence_idle_microseconds``) and/or aioinfer's own
``config.json`` keys; it applies over the model's config file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from aioinfer.errors import RepositoryError
from aioinfer.serving.messages import TensorMetadata
from aioinfer.serving.models import ServedModel
from aioinfer.serving.repository import ModelConfig

PLATFORM = "aioinfer_onnx"
"""The ``platform`` a served model reports (Triton's names its backend, e.g.
``onnxruntime_onnx``; aioinfer's own runtime serves every model here)."""

TRITON_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}
"""Protocol datatype -> Triton's ``data_type``."""


def triton_model_config(model: ServedModel) -> dict[str, Any]:
    """Triton's model configuration of ``model`` (a JSON object)."""
    compiled = model.compiled
    batch = compiled.max_batch_size() or 0
    config: dict[str, Any] = {
        "name": model.name,
        "platform": PLATFORM,
        "backend": "aioinfer",
        "version_policy": model.config.version_policy.to_mapping(),
        "max_batch_size": batch,
        "input": [{**_tensor(port, batch), "format": "FORMAT_NONE"} for port in model.inputs],
        "output": [_tensor(port, batch) for port in model.outputs],  # (outputs have no format)
    }
    if batch:
        timeout_ms = _property(model, "BATCH_TIMEOUT_MS")
        config["dynamic_batching"] = {
            "preferred_batch_size": [batch],
            "max_queue_delay_microseconds": int(float(timeout_ms or 0) * 1000),
        }
    if model.config.stateful is not None:
        idle = model.config.sequence_idle_timeout_s
        config["sequence_batching"] = {"max_sequence_idle_microseconds": int(idle * 1e6)}
    config["instance_group"] = [
        {"name": model.name, "kind": "KIND_CPU", "count": compiled.streams, "gpus": []}
    ]
    config["parameters"] = {
        "device": {"string_value": str(_property(model, "DEVICE_NAME") or model.config.device)},
        "max_concurrency": {"string_value": str(model.max_concurrency)},
        "max_queue": {"string_value": str(model.config.max_queue)},
    }
    return config


def _tensor(port: Any, batch: int) -> dict[str, Any]:
    metadata = TensorMetadata.of(port)
    dims = metadata.shape[1:] if batch and len(metadata.shape) > 0 else metadata.shape
    return {"name": metadata.name, "data_type": TRITON_TYPES[metadata.datatype], "dims": dims}


def _property(model: ServedModel, name: str) -> Any:
    compiled = model.compiled
    if name not in compiled.supported_properties():
        return None
    return compiled.get_property(name)


def apply_override(config: ModelConfig, text: str, where: str) -> ModelConfig:
    """``config`` with the override ``text`` (JSON) applied.

    Raises:
        RepositoryError: ``text`` is not a JSON object, holds a key that is neither one
            of Triton's that aioinfer honours nor aioinfer's own, or a value of the wrong
            type (named, with ``where`` the model).
    """
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise RepositoryError(f"{where}: the config override is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise RepositoryError(f"{where}: the config override must be a JSON object")
    values = dict(values)
    values.pop("name", None)  # Triton's overrides repeat the model's name
    changes = _from_triton(values, config, where)
    own = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    own = {key: value for key, value in own.items() if value is not None}
    own.update(changes)
    own.update(values)
    return ModelConfig.from_mapping(own, f"{where} (config override)")


def _from_triton(values: dict[str, Any], config: ModelConfig, where: str) -> dict[str, Any]:
    """The aioinfer config values that Triton's keys in ``values`` stand for (the keys
    are taken out of ``values``)."""
    changes: dict[str, Any] = {}
    batching = dict(config.batching) if isinstance(config.batching, Mapping) else {}
    if "max_batch_size" in values:
        size = _integer(values.pop("max_batch_size"), "max_batch_size", where)
        changes["batching"] = False if size == 0 else {**batching, "max_batch_size": size}
    dynamic = values.pop("dynamic_batching", None)
    if dynamic is not None:
        if not isinstance(dynamic, dict):
            raise RepositoryError(f"{where}: 'dynamic_batching' must be a JSON object")
        current = changes.get("batching", batching) or {}
        delay = dynamic.get("max_queue_delay_microseconds")
        if delay is not None:
            micros = _integer(delay, "max_queue_delay_microseconds", where)
            current = {**current, "timeout_ms": micros / 1000}
        changes["batching"] = current or True
    sequence = values.pop("sequence_batching", None)
    if sequence is not None:
        if not isinstance(sequence, dict):
            raise RepositoryError(f"{where}: 'sequence_batching' must be a JSON object")
        idle = sequence.get("max_sequence_idle_microseconds")
        if idle is not None:
            micros = _integer(idle, "max_sequence_idle_microseconds", where)
            changes["sequence_idle_timeout_s"] = micros / 1e6
    return changes


def _integer(value: Any, key: str, where: str) -> int:
    # Protobuf's JSON form writes 64-bit integers as strings: accept both.
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise RepositoryError(f"{where}: {key!r} must be an integer >= 0, got {value!r}")
