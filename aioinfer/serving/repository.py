"""The model repository: ``<repo>/<model>/<version>/model.onnx`` plus per-model config.

A repository is a directory with one directory per model; in it, one directory per
version (a positive integer) holding ``model.onnx``, and optionally ``config.json``:

    {
      "device": "CPU",                      // the device to compile for (default: below)
      "hint": "THROUGHPUT",                 // PERFORMANCE_HINT
      "batching": {"max_batch_size": 32, "timeout_ms": 1},   // or true / false
      "stateful": {"past": "present"},      // STATEFUL pairs, or "auto"
      "properties": {"NUM_STREAMS": 2},     // any other compile property
      "max_concurrency": 64,                // inferences in flight (default: see below)
      "max_queue": 256,                     // inferences waiting; beyond: HTTP 503
      "sequence_idle_timeout_s": 60,        // a sequence idle this long is dropped
      "max_sequences": 1000,                // open sequences; beyond: HTTP 503
      "generate": {"input_ids": "input_ids", "logits": "logits", "eos_token_id": 0},
                                            // a decoder that generates (docs/generation.md)
      "ray": {"num_replicas": 2},           // Ray Serve deployment options (aioinfer.ray)
      "pinned": false,                      // never unloaded under the memory budget
      "idle_unload_s": 600,                 // unloaded once idle this long
      "memory_bytes": "2GiB",               // accounted at this size, not as measured
      "memory_budget": "4GiB",              // the most its load may measure
      "version_policy": {"latest": {"num_versions": 1}}
                                            // the versions served, as Triton's (below)
    }

Of a model's versions, the server serves those its ``version_policy`` selects, in
Triton's form (:class:`VersionPolicy`): by default the latest one only, as Triton does;
``{"all": {}}`` serves every version, ``{"specific": {"versions": [1, 3]}}`` the ones
listed.

A ``tokenizer.json`` beside ``model.onnx`` (or beside the version directories) lets a
generating model take and give text.

A single ``.onnx`` file is a repository of one model (named after the file, version 1).

**A folder as an exporter writes it** is a model too, with nothing added: ``model.onnx``
(optimum) or ``onnx/model.onnx`` (sentence-transformers) directly in the model's
directory, without a version directory, is its version 1 (:attr:`ModelEntry.folder`
names the folder, where the tokenizer, ``generation_config.json``, the chat template
and the pooling config are read). Such a folder given as the repository itself is a
repository of that one model, named after the folder. The exporters write a
``config.json`` of their own (the Hugging Face model's): a ``config.json`` holding any of
``model_type``, ``architectures`` or ``transformers_version`` is the exporter's, read by
the text pipelines and generation, never as aioinfer's config (:func:`is_exporter_config`).

A version may hold ``model.blob`` instead of ``model.onnx``: a blob of ``aioinfer compile``
(or ``export_model``), imported without compiling on the device it was compiled for
(the config's ``hint`` and run-time ``properties`` apply; its ``device`` and
``batching`` do not). A single ``.blob`` file is a repository of one model too.

A model whose config names no device (or that has no ``config.json``) is served with
the defaults that serve single-row traffic best (:meth:`ModelConfig.compile_plan`,
docs/serving.md): the ``AUTO`` device, the THROUGHPUT hint, and dynamic batching
(``BATCH``; on an engine, up to 64 rows on one stream) for a batchable, stateless model;
each key given in the config overrides its part of that choice.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from aioinfer.errors import GenerationError, RepositoryError, ServingConfigError
from aioinfer.generation import GenerationConfig
from aioinfer.model import Model, batch_problem
from aioinfer.properties import num_cores

if TYPE_CHECKING:
    from aioinfer.core import Core

_logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
MODEL_FILE = "model.onnx"
BLOB_FILE = "model.blob"
EXPORTER_MODEL_FILES = (MODEL_FILE, "onnx/" + MODEL_FILE)
"""Where an exporter's folder holds its model: optimum's ``model.onnx``, then
sentence-transformers' ``onnx/model.onnx``."""
EXPORTER_CONFIG_KEYS = frozenset({"model_type", "architectures", "transformers_version"})
"""Keys of a Hugging Face model's ``config.json``, never of aioinfer's."""
DEFAULT_DEVICE = "AUTO"
"""The device of a model whose config names none: the best installed one."""
DEFAULT_HINT = "THROUGHPUT"
"""The hint of a model whose config names no device and no hint: many clients, one row
each, is a throughput workload."""
PYTHON_COMPUTE_DEVICES = frozenset({"CPU"})
"""Devices whose compute runs Python between its kernels (the numpy ``CPU`` device's
plan): next to a busy event loop such a compute thread waits for the GIL, so the server
batches for them in a worker process (``BATCH:PROCESS:AUTO``). An engine (ORT,
OpenVINO) computes without the GIL, and its batches run on threads of the server's
process (``BATCH:AUTO``): measured with ``benchmarks/serving.py`` (docs/serving.md), the
worker process cost about 10% more CPU per request (pickling, the socket, the worker's
threads), and ``BATCH:AUTO`` on ORT served more requests per second in 14 rounds of 20."""


ENGINE_MAX_BATCH_SIZE = 64
"""The most rows of a batch the server forms for an engine (ORT, OpenVINO) by default;
and, unless the config sets a hint or ``NUM_STREAMS``, the batches compute on one
stream (of :func:`engine_threads` threads). Every batch reads all the weights,
whatever its rows: for the MLP of ``benchmarks/serving.py`` a one-row batch cost
0.46 ms of CPU, a 32-row one 0.07 ms a row. On a stream per core with up to 32 rows,
the batches held 13-15 rows on average; on one stream with up to 64, 17-28 (the
requests that arrive while a batch computes all join the next one), and the benchmark
served more requests a second in each of five alternating pairs of rounds (35% more on
average; server CPU per request 0.222 ms instead of 0.245; docs/serving.md)."""


def engine_threads() -> int:
    """The threads of the one stream an engine's batches compute on by default: every
    core but one, which the event loop keeps (it parses, answers and batches every
    request). With both cores of two, onnxruntime's second thread and the loop took turns
    on one core: ``benchmarks/serving.py`` served 16-38% more requests a second with one
    compute thread in five of six alternating rounds (docs/serving.md)."""
    return max(1, num_cores() - 1)


_POLICY_FORMS = (
    '{"latest": {"num_versions": N}}, {"all": {}} or {"specific": {"versions": [V, ...]}}'
)


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model the server serves: Triton's ``version_policy``.

    ``latest`` (the default, with ``num_versions`` 1, as Triton's): the ``num_versions``
    highest versions of the repository; ``all``: every version; ``specific``: the
    ``versions`` listed, those of them the repository holds (a listed version without
    its directory is logged and skipped, as Triton does). A version the policy does not
    serve is not compiled: requests to it are answered as for an unknown version.
    """

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def from_mapping(cls, value: Mapping[str, Any], where: str) -> VersionPolicy:
        """The policy a config file's ``version_policy`` object describes (Triton's JSON
        form; 64-bit integers may be strings, as protobuf writes them).

        Raises:
            RepositoryError: not one of the three forms, an unknown key, or a count or
                version that is not a positive integer (named, with ``where`` the file).
        """
        described = json.dumps(value)
        if len(value) != 1 or next(iter(value)) not in ("latest", "all", "specific"):
            raise RepositoryError(
                f"{where}: 'version_policy' must be {_POLICY_FORMS}, got {described}"
            )
        ((kind, options),) = value.items()
        known = {"latest": {"num_versions"}, "all": set(), "specific": {"versions"}}[kind]
        if not isinstance(options, dict) or set(options) - known:
            keys = ", ".join(sorted(known)) or "none"
            raise RepositoryError(
                f"{where}: 'version_policy' {kind!r} must be an object with key(s): {keys}; "
                f"got {described}"
            )
        if kind == "latest":
            count = _positive(options.get("num_versions"), "num_versions", where)
            return cls("latest", num_versions=count)
        if kind == "specific":
            listed = options.get("versions")
            if not isinstance(listed, list) or not listed:
                raise RepositoryError(
                    f"{where}: 'version_policy' 'specific' must list its 'versions' "
                    f"(positive integers), got {described}"
                )
            versions = tuple(sorted({_positive(v, "versions", where) for v in listed}))
            return cls("specific", versions=versions)
        return cls("all")

    def to_mapping(self) -> dict[str, Any]:
        """The policy in Triton's JSON form (``config.json``'s and Triton's model
        configuration's ``version_policy``)."""
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"all": {}}

    def select(self, versions: Iterable[str]) -> list[str]:
        """The ones of ``versions`` (a repository's, as strings) the policy serves,
        lowest first."""
        ordered = sorted(versions, key=int)
        if self.kind == "latest":
            return ordered[-self.num_versions :]
        if self.kind == "specific":
            return [version for version in ordered if int(version) in self.versions]
        return ordered


def _positive(value: Any, key: str, where: str) -> int:
    # Protobuf's JSON form writes 64-bit integers as strings: accept both.
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    expected = "integers" if key == "versions" else "an integer"
    raise RepositoryError(
        f"{where}: 'version_policy' {key!r} must be {expected} >= 1, got {value!r}"
    )


@dataclass(frozen=True)
class CompilePlan:
    """How the server compiles one model version: the device string, the compile config,
    and what the server decided itself (for the startup log; empty when the config named
    the device)."""

    device: str
    config: dict[str, Any]
    decided: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    """How one model is compiled and served.

    ``batching`` is None (the device decides: the THROUGHPUT hint batches a batchable
    model), False (never batch) or ``{"max_batch_size": N, "timeout_ms": T}`` (the BATCH
    device). ``max_concurrency`` None means: ``MAX_BATCH_SIZE`` x streams x 2 for a
    batching model, else the compiled model's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``.
    ``max_sequences`` None means the server's default. ``version_policy`` chooses the
    versions served (:class:`VersionPolicy`; in a config file, its JSON form). ``generate`` (a
    :class:`~aioinfer.generation.GenerationConfig`, or its mapping) serves the model's
    generate endpoints. ``ray`` holds the model's Ray Serve deployment options (see
    :mod:`aioinfer.ray`), unused by ``aioinfer serve``. ``device`` None means: the server
    chooses (:meth:`compile_plan`). ``pinned``, ``idle_unload_s``, ``memory_bytes`` and
    ``memory_budget`` (bytes; in a config file also a size such as ``"2GiB"``) are the
    model manager's (:mod:`aioinfer.serving.manager`).
    """

    device: str | None = None
    hint: str | None = None
    batching: Mapping[str, Any] | bool | None = None
    stateful: Mapping[str, str] | str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)
    max_concurrency: int | None = None
    max_queue: int = 256
    sequence_idle_timeout_s: float = 60.0
    max_sequences: int | None = None
    generate: Mapping[str, Any] | GenerationConfig | None = None
    ray: Mapping[str, Any] = field(default_factory=dict)
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    pinned: bool = False
    idle_unload_s: float | None = None
    memory_bytes: int | None = None
    memory_budget: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str) -> ModelConfig:
        """Check and convert a config file's contents.

        Raises:
            RepositoryError: an unknown key or a value of the wrong type (named, with
                ``where`` the file).
        """
        kinds: dict[str, tuple[type, ...]] = {
            "device": (str,),
            "hint": (str,),
            "batching": (dict, bool),
            "stateful": (dict, str),
            "properties": (dict,),
            "max_concurrency": (int,),
            "max_queue": (int,),
            "sequence_idle_timeout_s": (int, float),
            "max_sequences": (int,),
            "generate": (dict,),
            "ray": (dict,),
            "version_policy": (dict, VersionPolicy),
            "pinned": (bool,),
            "idle_unload_s": (int, float),
            "memory_bytes": (int, str),
            "memory_budget": (int, str),
        }
        for key, value in values.items():
            if key not in kinds:
                raise RepositoryError(
                    f"{where}: unknown key {key!r}; known keys: {', '.join(kinds)}"
                )
            # bool is an int to Python, not to a config file.
            if not isinstance(value, kinds[key]) or (
                isinstance(value, bool) and bool not in kinds[key]
            ):
                names = " or ".join(k.__name__ for k in kinds[key])
                names = "object" if key == "version_policy" else names
                raise RepositoryError(f"{where}: {key!r} must be {names}, got {value!r}")
        batching = values.get("batching")
        if isinstance(batching, dict):
            unknown = set(batching) - {"max_batch_size", "timeout_ms"}
            if unknown:
                raise RepositoryError(
                    f"{where}: unknown batching key(s) {sorted(unknown)}; "
                    "known: max_batch_size, timeout_ms"
                )
        if "generate" in values:
            try:
                GenerationConfig.from_mapping(values["generate"])
            except GenerationError as exc:
                raise RepositoryError(f"{where}: {exc}") from None
        for key in ("max_concurrency", "max_queue", "max_sequences"):
            if key in values and values[key] < (0 if key == "max_queue" else 1):
                raise RepositoryError(f"{where}: {key!r} is {values[key]}, too small")
        if "idle_unload_s" in values and values["idle_unload_s"] <= 0:
            raise RepositoryError(
                f"{where}: 'idle_unload_s' must be above 0, got {values['idle_unload_s']}"
            )
        sizes = {}
        for key in ("memory_bytes", "memory_budget"):
            if key in values:
                try:
                    sizes[key] = parse_bytes(values[key], key)
                except ServingConfigError as exc:
                    raise RepositoryError(f"{where}: {exc}") from None
        values = {**values, **sizes}
        policy = values.get("version_policy")
        if isinstance(policy, dict):
            values = {**values, "version_policy": VersionPolicy.from_mapping(policy, where)}
        return cls(**values)

    def compile_plan(self, core: Core, model: Model) -> CompilePlan:
        """How ``model`` (one version of this model) is compiled.

        With a ``device`` in the config: that device, with the config's hint, batching,
        state and properties (:meth:`device_and_config`). Without one, the server's
        defaults for single-row traffic, each overridden by the config's own key: the
        ``AUTO`` device (the best installed: ORT, OPENVINO, then CPU), the THROUGHPUT hint
        (streams on every core), and for a model the ``BATCH`` device can batch (a shared
        symbolic first dimension, no state) dynamic batching (1 ms: concurrent single
        rows run as one batch). The batches compute on threads of the server's process
        (``BATCH:AUTO``) when the device AUTO picks first is an engine: up to
        :data:`ENGINE_MAX_BATCH_SIZE` rows, on one stream unless the config sets a hint
        or ``NUM_STREAMS``, of :func:`engine_threads` threads unless it sets
        ``INFERENCE_NUM_THREADS``; when it is one of :data:`PYTHON_COMPUTE_DEVICES` (the numpy
        CPU device) and the machine has two cores or more, in a worker process
        (``BATCH:PROCESS:AUTO``, up to the BATCH device's 32 rows), so that no compute
        thread waits for the event loop's GIL. Measured with ``benchmarks/serving.py``
        (docs/serving.md).

        Raises:
            UnknownDeviceError: the config's device is unknown.
        """
        if self.device is not None:
            supported = core.get_property(self.device, "SUPPORTED_PROPERTIES")
            return CompilePlan(*self.device_and_config(supported))
        decided = [f"device {DEFAULT_DEVICE}"]
        defaults = self
        device = DEFAULT_DEVICE
        if self.hint is None:
            decided.append(f"hint {DEFAULT_HINT}")
            defaults = replace(defaults, hint=DEFAULT_HINT)
        if self.batching is None:
            problem = (
                "it keeps state" if self.stateful else batch_problem(model.inputs, model.outputs)
            )
            if problem is None:
                decided.append("dynamic batching (BATCH)")
                defaults = replace(defaults, batching=True)
                first = _first_usable_device(core, self.properties)
                if first in PYTHON_COMPUTE_DEVICES and num_cores() >= 2:
                    decided.append(f"a worker process (PROCESS: {first} computes in Python)")
                    device = f"PROCESS:{DEFAULT_DEVICE}"
                else:
                    batching = {"max_batch_size": ENGINE_MAX_BATCH_SIZE}
                    decided.append(f"batches of up to {ENGINE_MAX_BATCH_SIZE} rows")
                    defaults = replace(defaults, batching=batching)
                    if self.hint is None and "NUM_STREAMS" not in self.properties:
                        decided.append("one stream")
                        properties = {**self.properties, "NUM_STREAMS": 1}
                        if "INFERENCE_NUM_THREADS" not in self.properties:
                            threads = engine_threads()
                            decided.append(f"{threads} compute thread(s): a core for the loop")
                            properties["INFERENCE_NUM_THREADS"] = threads
                        defaults = replace(defaults, properties=properties)
            else:
                decided.append(f"no batching: {problem}")
                defaults = replace(defaults, batching=False)
        supported = core.get_property(device, "SUPPORTED_PROPERTIES")
        return CompilePlan(
            *replace(defaults, device=device).device_and_config(supported), tuple(decided)
        )

    def device_and_config(self, supported: Collection[str]) -> tuple[str, dict[str, Any]]:
        """The device string and compile config this model is compiled with, given the
        properties the device supports (the config's device, else ``AUTO``)."""
        config = dict(self.properties)
        device = self.device or DEFAULT_DEVICE
        if self.hint is not None:
            config["PERFORMANCE_HINT"] = self.hint
        if self.stateful is not None:
            config["STATEFUL"] = self.stateful
        if self.batching is False:
            if "ALLOW_AUTO_BATCHING" in supported:  # else the device never batches
                config["ALLOW_AUTO_BATCHING"] = False
        elif self.batching is not None:
            device = f"BATCH:{device}"
            if isinstance(self.batching, Mapping):
                if "max_batch_size" in self.batching:
                    config["MAX_BATCH_SIZE"] = self.batching["max_batch_size"]
                if "timeout_ms" in self.batching:
                    config["BATCH_TIMEOUT_MS"] = self.batching["timeout_ms"]
        return device, config


@dataclass(frozen=True)
class ModelEntry:
    """One model of a repository: its versions (name -> model file) and config."""

    name: str
    versions: dict[str, Path]
    config: ModelConfig
    folder: Path | None = None
    """The exporter's folder the model came in (its tokenizer, ``config.json`` and the
    other files the exporter wrote), or None for a ``<model>/<version>/`` model."""

    def served_versions(self) -> dict[str, Path]:
        """The versions the config's ``version_policy`` serves (name -> model file),
        lowest first.

        Raises:
            RepositoryError: the policy serves none of the repository's versions.
        """
        policy = self.config.version_policy
        served = policy.select(self.versions)
        if not served:
            held = ", ".join(sorted(self.versions, key=int))
            raise RepositoryError(
                f"at least one version must be available under the version policy of model "
                f"{self.name!r}: {json.dumps(policy.to_mapping())} serves none of the "
                f"versions in the repository ({held})"
            )
        return {version: self.versions[version] for version in served}


class ModelRepository:
    """The models found under a repository directory (or one ``.onnx`` file).

    ``configs`` overrides or supplies the config of models by name (for an app built in
    code, or a single file).

    Raises:
        RepositoryError: the path does not exist, holds no model, a model directory has no
            version with ``model.onnx``, or a config file is invalid.
    """

    def __init__(
        self,
        path: str | Path,
        configs: Mapping[str, ModelConfig] | None = None,
        *,
        model_name: str | None = None,
    ) -> None:
        self.path = Path(path)
        self._overrides = overrides = dict(configs or {})
        if self.path.is_file():
            if self.path.suffix not in (".onnx", ".blob"):
                raise RepositoryError(
                    f"{str(self.path)!r} is not an .onnx file or a directory (nor a .blob)"
                )
            name = model_name or self.path.stem
            entries = [ModelEntry(name, {"1": self.path}, overrides.get(name, ModelConfig()))]
        elif self.path.is_dir() and exporter_model_file(self.path) is not None:
            name = model_name or self.path.resolve().name
            entries = [self._scan(self.path, overrides.get(name), name)]
        elif model_name is not None:
            raise RepositoryError(
                f"model_name {model_name!r}: {str(self.path)!r} is a repository of models, "
                "named after their directories (a name is given to one model file or one "
                "exporter's folder)"
            )
        elif self.path.is_dir():
            entries = [
                self._scan(directory, overrides.get(directory.name))
                for directory in sorted(self.path.iterdir())
                if directory.is_dir() and not directory.name.startswith((".", "_"))
            ]
        else:
            raise RepositoryError(f"model repository {str(self.path)!r} does not exist")
        if not entries:
            raise RepositoryError(
                f"no models in {str(self.path)!r}: expected <repo>/<model>/<version>/{MODEL_FILE}"
            )
        self.models: dict[str, ModelEntry] = {entry.name: entry for entry in entries}
        unknown = set(overrides) - set(self.models)
        if unknown:
            raise RepositoryError(f"configs given for unknown model(s) {sorted(unknown)}")

    def model_names(self) -> list[str]:
        """The names of the models in the repository now (its directories, read again)."""
        if self.path.is_file() or exporter_model_file(self.path) is not None:
            return list(self.models)
        return sorted(
            child.name
            for child in self.path.iterdir()
            if child.is_dir() and not child.name.startswith((".", "_"))
        )

    def refresh(self, name: str) -> ModelEntry:
        """Read model ``name`` again from the repository (its versions and config file,
        as a load at run time does), and keep it.

        Raises:
            RepositoryError: the repository has no model directory of that name, or it
                is invalid.
        """
        directory = self.path / name
        if self.path.is_file() or name in ("", ".", "..") or "/" in name or "\\" in name:
            if name in self.models:
                return self.models[name]
            raise RepositoryError(f"no model {name!r} in the repository")
        if exporter_model_file(self.path) is not None:  # one exporter's folder
            if name not in self.models:
                raise RepositoryError(f"no model {name!r} in the repository")
            entry = self._scan(self.path, self._overrides.get(name), name)
            self.models[name] = entry
            return entry
        if name.startswith((".", "_")) or not directory.is_dir():
            raise RepositoryError(f"no model {name!r} in the repository")
        entry = self._scan(directory, self._overrides.get(name))
        self.models[name] = entry
        return entry

    def _scan(
        self, directory: Path, override: ModelConfig | None, name: str | None = None
    ) -> ModelEntry:
        name = name or directory.name
        versions = {
            child.name: model
            for child in directory.iterdir()
            if child.is_dir() and child.name.isdigit() and int(child.name) > 0
            for model in (child / MODEL_FILE, child / BLOB_FILE)
            if model.is_file()
        }
        folder = None
        if not versions and (model_file := exporter_model_file(directory)) is not None:
            versions, folder = {"1": model_file}, directory
        if not versions:
            raise RepositoryError(
                f"model {name!r} has no version: expected "
                f"{directory!s}/<version>/{MODEL_FILE} with <version> a positive integer "
                f"(or an exporter's folder: {' or '.join(EXPORTER_MODEL_FILES)})"
            )
        config_path = directory / CONFIG_FILE
        config = override or ModelConfig()
        if override is None and config_path.is_file():
            values = _read_json(config_path)
            if not is_exporter_config(values):
                config = ModelConfig.from_mapping(values, str(config_path))
        entry = ModelEntry(name, versions, config, folder)
        for missing in sorted(set(config.version_policy.versions) - set(map(int, versions))):
            _logger.warning(
                "version %d is specified for model %r, but the version directory is not present",
                missing,
                entry.name,
            )
        return entry


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: int | str, what: str = "memory_budget") -> int:
    """A size in bytes: an integer, or a number with a unit (``"6GiB"``, ``"512MB"``,
    ``"1.5G"``; SI units are powers of 10, ``KiB``/``MiB``/``GiB``/``TiB`` of 2).

    Raises:
        ServingConfigError: not a positive size (``what`` names the option).
    """
    number: float
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (
        match := re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    ):
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise ServingConfigError(
                f"{what}: unknown unit {match.group(2)!r} in {value!r}; expected one of "
                "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
            )
        number = float(match.group(1)) * _UNITS[unit]
    else:
        raise ServingConfigError(
            f"{what} must be a number of bytes or a size such as '6GiB', got {value!r}"
        )
    if number < 1:
        raise ServingConfigError(f"{what} must be at least 1 byte, got {value!r}")
    return int(number)


def exporter_model_file(directory: Path) -> Path | None:
    """The model file of an exporter's folder (:data:`EXPORTER_MODEL_FILES`, the first
    found), or None when ``directory`` is not one."""
    for place in EXPORTER_MODEL_FILES:
        if (directory / place).is_file():
            return directory / place
    return None


def is_exporter_config(values: Mapping[str, Any]) -> bool:
    """Whether a ``config.json``'s contents are an exporter's (a Hugging Face model's:
    any of :data:`EXPORTER_CONFIG_KEYS`) rather than aioinfer's."""
    return not EXPORTER_CONFIG_KEYS.isdisjoint(values)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RepositoryError(f"{path!s}: cannot read it as JSON: {exc}") from None
    if not isinstance(values, dict):
        raise RepositoryError(f"{path!s}: expected a JSON object")
    return values


def _first_usable_device(core: Core, properties: Mapping[str, Any]) -> str | None:
    """The first device of AUTO's priority list (``properties``' ``DEVICE_PRIORITIES``,
    else AUTO's default) that can run models here, or None."""
    from aioinfer.devices.auto.plugin import unavailable_reason
    from aioinfer.devices.auto.properties import DEFAULT_PRIORITIES, DEVICE_PRIORITIES

    given = properties.get("DEVICE_PRIORITIES")
    try:
        priorities = DEFAULT_PRIORITIES if given is None else DEVICE_PRIORITIES.parse(given)
    except ValueError:  # the compile says what is wrong with it
        return None
    for device in priorities:
        if unavailable_reason(core, device) is None:
            return str(device)
    return None
