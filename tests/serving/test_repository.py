"""The model repository layout, per-model config files and the errors they raise."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from aioinfer import Core, RepositoryError
from aioinfer.properties import num_cores
from aioinfer.serving import ModelConfig, ModelRepository
from aioinfer.serving.repository import engine_threads
from tests.helpers import mlp_model
from tests.serving.conftest import write_config, write_model

CPU_PROPERTIES = ("PERFORMANCE_HINT", "ALLOW_AUTO_BATCHING", "STATEFUL")


def test_versions_and_configs_are_found(tmp_path: Path) -> None:
    write_model(tmp_path, "a", 1, mlp_model())
    write_model(tmp_path, "a", 10, mlp_model())
    write_model(tmp_path, "b", 3, mlp_model())
    write_config(
        tmp_path, "a", {"device": "CPU", "hint": "THROUGHPUT", "batching": {"max_batch_size": 4}}
    )
    (tmp_path / "a" / "notes").mkdir()  # not a version: ignored
    (tmp_path / ".cache").mkdir()  # hidden: ignored
    repository = ModelRepository(tmp_path)
    assert sorted(repository.models) == ["a", "b"]
    a = repository.models["a"]
    assert sorted(a.versions) == ["1", "10"] and list(a.served_versions()) == ["10"]
    assert a.config.hint == "THROUGHPUT"
    assert a.config.device_and_config(CPU_PROPERTIES) == (
        "BATCH:CPU",
        {"PERFORMANCE_HINT": "THROUGHPUT", "MAX_BATCH_SIZE": 4},
    )
    assert repository.models["b"].config == ModelConfig()


def test_a_single_file_is_one_model(tmp_path: Path) -> None:
    onnx.save(mlp_model(), tmp_path / "classifier.onnx")
    repository = ModelRepository(tmp_path / "classifier.onnx")
    assert list(repository.models) == ["classifier"]
    assert repository.models["classifier"].versions == {"1": tmp_path / "classifier.onnx"}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, ("CPU", {})),
        ({"batching": True}, ("BATCH:CPU", {})),
        (
            {"batching": False, "hint": "THROUGHPUT"},
            ("CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "ALLOW_AUTO_BATCHING": False}),
        ),
        (
            {"stateful": "auto", "properties": {"NUM_STREAMS": 2}},
            ("CPU", {"NUM_STREAMS": 2, "STATEFUL": "auto"}),
        ),
        ({"batching": {"timeout_ms": 3}}, ("BATCH:CPU", {"BATCH_TIMEOUT_MS": 3})),
    ],
)
def test_config_becomes_device_and_properties(config, expected) -> None:
    config = ModelConfig.from_mapping({"device": "CPU", **config}, "x")
    assert config.device_and_config(CPU_PROPERTIES) == expected


THREADS = engine_threads()  # every core but one: the event loop keeps one
ENGINE_DECIDED = (
    "device AUTO",
    "hint THROUGHPUT",
    "dynamic batching (BATCH)",
    "batches of up to 64 rows",
    "one stream",
    f"{THREADS} compute thread(s): a core for the loop",
)
ONE_STREAM = {"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": THREADS}


@pytest.mark.parametrize(
    ("config", "device", "properties", "decided"),
    [
        (  # ORT first: an engine computes without the GIL, on the server's threads,
            # in batches of up to 64 rows on one stream
            {},
            "BATCH:AUTO",
            {"PERFORMANCE_HINT": "THROUGHPUT", **ONE_STREAM, "MAX_BATCH_SIZE": 64},
            ENGINE_DECIDED,
        ),
        (
            {"properties": {"DEVICE_PRIORITIES": "OPENVINO,CPU"}},
            "BATCH:AUTO",
            {
                "PERFORMANCE_HINT": "THROUGHPUT",
                "DEVICE_PRIORITIES": "OPENVINO,CPU",
                **ONE_STREAM,
                "MAX_BATCH_SIZE": 64,
            },
            ENGINE_DECIDED,
        ),
        (  # the config's streams (or hint) stand; the batches still hold up to 64 rows
            {"properties": {"NUM_STREAMS": 2}},
            "BATCH:AUTO",
            {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "MAX_BATCH_SIZE": 64},
            ENGINE_DECIDED[:-2],
        ),
        (  # the config's threads stand on the one stream
            {"properties": {"INFERENCE_NUM_THREADS": 2}},
            "BATCH:AUTO",
            {
                "PERFORMANCE_HINT": "THROUGHPUT",
                "INFERENCE_NUM_THREADS": 2,
                "NUM_STREAMS": 1,
                "MAX_BATCH_SIZE": 64,
            },
            ENGINE_DECIDED[:-1],
        ),
        (
            {"hint": "THROUGHPUT"},
            "BATCH:AUTO",
            {"PERFORMANCE_HINT": "THROUGHPUT", "MAX_BATCH_SIZE": 64},
            ("device AUTO", "dynamic batching (BATCH)", "batches of up to 64 rows"),
        ),
        (  # the numpy device computes in Python: a worker process, given two cores
            {"properties": {"DEVICE_PRIORITIES": "CPU"}},
            "BATCH:PROCESS:AUTO" if num_cores() >= 2 else "BATCH:AUTO",
            {"PERFORMANCE_HINT": "THROUGHPUT", "DEVICE_PRIORITIES": "CPU"},
            ("device AUTO", "hint THROUGHPUT", "dynamic batching (BATCH)")
            + (("a worker process (PROCESS: CPU computes in Python)",) if num_cores() >= 2 else ()),
        ),
        (
            {"hint": "LATENCY", "batching": {"max_batch_size": 4}},
            "BATCH:AUTO",
            {"PERFORMANCE_HINT": "LATENCY", "MAX_BATCH_SIZE": 4},
            ("device AUTO",),
        ),
        (
            {"batching": False},
            "AUTO",
            {"PERFORMANCE_HINT": "THROUGHPUT", "ALLOW_AUTO_BATCHING": False},
            ("device AUTO", "hint THROUGHPUT"),
        ),
        (
            {"stateful": "auto"},
            "AUTO",
            {"PERFORMANCE_HINT": "THROUGHPUT", "STATEFUL": "auto", "ALLOW_AUTO_BATCHING": False},
            ("device AUTO", "hint THROUGHPUT", "no batching: it keeps state"),
        ),
        ({"device": "CPU"}, "CPU", {}, ()),
    ],
)
def test_without_a_device_the_server_chooses(config, device, properties, decided) -> None:
    core = Core()
    plan = ModelConfig.from_mapping(config, "x").compile_plan(core, core.read_model(mlp_model()))
    assert (plan.device, plan.config, plan.decided) == (device, properties, decided)


def test_batching_false_on_a_device_without_auto_batching_sets_nothing() -> None:
    config = ModelConfig.from_mapping({"batching": False, "device": "OTHER"}, "x")
    assert config.device_and_config(("PERFORMANCE_HINT",)) == ("OTHER", {})


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("missing", ["does not exist"]),
        ("empty", ["no models in", "<repo>/<model>/<version>/model.onnx"]),
        ("no version", ["model 'm' has no version", "positive integer"]),
        ("text file", ["is not an .onnx file or a directory"]),
        ("bad json", ["config.json", "cannot read it as JSON"]),
        ("unknown key", ["unknown key 'gpu'", "known keys: device"]),
        ("wrong type", ["'max_queue' must be int, got 'many'"]),
        ("bool for int", ["'max_concurrency' must be int, got True"]),
        ("batching key", ["unknown batching key(s) ['size']"]),
        ("too small", ["'max_concurrency' is 0, too small"]),
    ],
)
def test_bad_repositories_are_refused_clearly(
    tmp_path: Path, layout: str, words: list[str]
) -> None:
    configs = {
        "bad json": "{",
        "unknown key": json.dumps({"gpu": 1}),
        "wrong type": json.dumps({"max_queue": "many"}),
        "bool for int": json.dumps({"max_concurrency": True}),
        "batching key": json.dumps({"batching": {"size": 3}}),
        "too small": json.dumps({"max_concurrency": 0}),
    }
    path = tmp_path
    if layout == "missing":
        path = tmp_path / "nowhere"
    elif layout == "no version":
        (tmp_path / "m" / "latest").mkdir(parents=True)
    elif layout == "text file":
        path = tmp_path / "model.txt"
        path.write_text("hi")
    elif layout in configs:
        write_model(tmp_path, "m", 1, mlp_model())
        (tmp_path / "m" / "config.json").write_text(configs[layout])
    with pytest.raises(RepositoryError) as caught:
        ModelRepository(path)
    for word in words:
        assert word in str(caught.value)


def test_configs_in_code_override_files_and_must_name_models(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 1, mlp_model())
    write_config(tmp_path, "m", {"hint": "LATENCY"})
    repository = ModelRepository(tmp_path, {"m": ModelConfig(hint="THROUGHPUT")})
    assert repository.models["m"].config.hint == "THROUGHPUT"
    with pytest.raises(RepositoryError, match=r"unknown model\(s\) \['x'\]"):
        ModelRepository(tmp_path, {"x": ModelConfig()})


HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}


@pytest.mark.parametrize("place", ["model.onnx", "onnx/model.onnx"])
def test_an_exporters_folder_is_a_model_in_a_repository(tmp_path: Path, place: str) -> None:
    folder = tmp_path / "repo" / "exported"
    (folder / place).parent.mkdir(parents=True)
    onnx.save(mlp_model(), folder / place)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))  # the exporter's, not ours
    write_model(tmp_path / "repo", "plain", 1, mlp_model())
    repository = ModelRepository(tmp_path / "repo")
    assert sorted(repository.models) == ["exported", "plain"]
    exported = repository.models["exported"]
    assert exported.versions == {"1": folder / place}
    assert exported.folder == folder and exported.config == ModelConfig()
    assert repository.models["plain"].folder is None
    assert repository.refresh("exported") == exported


def test_an_exporters_folder_given_alone_is_a_repository_of_one(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    onnx.save(mlp_model(), folder / "model.onnx")
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    repository = ModelRepository(folder)
    assert list(repository.models) == ["tiny-llama"]
    assert repository.models["tiny-llama"].folder == folder
    assert repository.model_names() == ["tiny-llama"]
    with pytest.raises(RepositoryError, match="no model 'other'"):
        repository.refresh("other")


def test_aioinfers_config_beside_an_exporters_model_is_still_read(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "m"
    folder.mkdir(parents=True)
    onnx.save(mlp_model(), folder / "model.onnx")
    (folder / "config.json").write_text(json.dumps({"device": "CPU", "max_queue": 3}))
    entry = ModelRepository(tmp_path / "repo").models["m"]
    assert entry.config.device == "CPU" and entry.config.max_queue == 3
    (folder / "config.json").write_text(json.dumps({"device": "CPU", "model_type": "bert"}))
    assert ModelRepository(tmp_path / "repo").models["m"].config == ModelConfig()
